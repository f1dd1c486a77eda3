"""Tokenizers the engine uses: a folder's `tokenizer.json` read by the `tokenizers` library directly, and a
byte-level tokenizer for `dummy:` targets.

Why not `transformers.AutoTokenizer`: importing transformers and building its tokenizer wrapper took ~4 s of a
13 s `specdec generate hi` (NOTES.md, issue 18); reading `tokenizer.json` with `tokenizers` takes ~0.3 s. The
engine needs little of the wrapper: encode, decode, the chat template, the EOS id and the vocabulary.
`FastTokenizer` gives exactly that, with the same results as transformers for the folders it accepts (tested
against transformers on the default model), and hands any other attribute to a transformers tokenizer loaded
on first use. Folders it cannot vouch for (no `tokenizer.json`, tokenizer classes that rewrite the
post-processor, truncation or padding set in the file) load through transformers as before.
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import cached_property
from pathlib import Path
from typing import Any

from specdec.errors import ConfigError, ModelLoadError

# transformers tokenizer classes that use tokenizer.json as it is (no rebuilt post-processor or pre-tokenizer)
_PLAIN_CLASSES = ("TokenizersBackend", "PreTrainedTokenizerFast")
# tokenizer_config.json keys that make transformers change what tokenizer.json alone would do
_REWRITING_KEYS = ("add_bos_token", "add_eos_token", "add_prefix_space", "split_special_tokens")
_SPECIAL_KEYS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


def load_tokenizer(folder: Path) -> Any:
    """The tokenizer of a Hugging Face folder: a `FastTokenizer` when the folder allows, else transformers'."""
    fast = FastTokenizer.from_folder(folder)
    if fast is not None:
        return fast
    return load_transformers_tokenizer(folder)


def load_transformers_tokenizer(folder: Path) -> Any:
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(folder))
    except Exception as exc:  # transformers raises many kinds for an unreadable folder
        raise ModelLoadError(f"cannot load the tokenizer in {folder}: {exc}") from None


class FastTokenizer:
    """The subset of a transformers tokenizer the engine uses, on a `tokenizers.Tokenizer`."""

    def __init__(self, folder: Path, backend: Any, config: dict[str, Any], chat_template: str | None) -> None:
        self.folder = folder
        self.backend = backend
        self.chat_template = chat_template
        self.model_max_length = int(config.get("model_max_length") or 1_000_000_000)
        self.clean_up_tokenization_spaces = bool(config.get("clean_up_tokenization_spaces", False))
        self.special_tokens_map = {k: _token_text(config[k]) for k in _SPECIAL_KEYS if config.get(k) is not None}
        for key in _SPECIAL_KEYS:
            text = self.special_tokens_map.get(key)
            setattr(self, key, text)
            setattr(self, f"{key}_id", None if text is None else backend.token_to_id(text))

    @classmethod
    def from_folder(cls, folder: Path) -> "FastTokenizer | None":
        """The folder's tokenizer, or None when only transformers can reproduce it faithfully."""
        folder = Path(folder)
        path = folder / "tokenizer.json"
        if not path.is_file():
            return None
        try:
            config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
            if not isinstance(config, dict):
                return None
        except (OSError, ValueError):
            config = {}
        if config.get("tokenizer_class", "PreTrainedTokenizerFast") not in _PLAIN_CLASSES:
            return None
        if any(key in config for key in _REWRITING_KEYS):
            return None
        template = _chat_template(folder, config)
        if template is False:
            return None
        try:
            from tokenizers import Tokenizer

            backend = Tokenizer.from_file(str(path))
        except ImportError:
            return None
        except Exception as exc:  # tokenizers raises plain Exceptions for a malformed file
            raise ModelLoadError(f"cannot load the tokenizer {path}: {exc}") from None
        if backend.truncation is not None or backend.padding is not None:
            return None  # transformers would apply them to every encode
        tokenizer = cls(folder, backend, config, template)
        if any(tokenizer.special_id(text) is None for text in tokenizer.special_tokens_map.values()):
            return None  # transformers would add the missing special tokens to the vocabulary
        return tokenizer

    # ------------------------------------------------------------------------------------------------ ids
    def special_id(self, text: str) -> int | None:
        return self.backend.token_to_id(text)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        text = self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)
        if self.clean_up_tokenization_spaces and type(self.backend.model).__name__ != "BPE":
            text = _clean_up_tokenization(text)  # transformers skips the clean-up for BPE models too
        return text

    def get_vocab(self) -> dict[str, int]:
        return self.backend.get_vocab(with_added_tokens=True)

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=False)

    def __len__(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    # --------------------------------------------------------------------------------------------- chat
    def apply_chat_template(self, conversation: list[dict], tokenize: bool = True, add_generation_prompt: bool = False,
                            **kwargs: Any) -> str | list[int]:
        """Render messages the way transformers does (same jinja environment and variables)."""
        if not self.chat_template:
            raise ConfigError("this tokenizer has no chat template; pass text with chat=False")
        import jinja2

        try:
            text = self._compiled_template.render(messages=conversation, tools=kwargs.pop("tools", None),
                                                  documents=kwargs.pop("documents", None),
                                                  add_generation_prompt=add_generation_prompt,
                                                  **{**self.special_tokens_map, **kwargs})
        except jinja2.TemplateError as exc:
            raise ConfigError(f"the chat template rejected the messages: {exc}") from None
        return self.encode(text, add_special_tokens=False) if tokenize else text

    @cached_property
    def _compiled_template(self):
        import jinja2
        from jinja2.ext import loopcontrols
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message: str) -> None:
            raise jinja2.exceptions.TemplateError(message)

        def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
            return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
        env.filters["tojson"] = tojson
        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        try:
            return env.from_string(self.chat_template)
        except jinja2.TemplateError as exc:
            raise ModelLoadError(f"the chat template in {self.folder} does not parse: {exc}") from None

    # ---------------------------------------------------------------------------------------- the rest
    @cached_property
    def hf(self) -> Any:
        """The transformers tokenizer of the same folder, for anything beyond the engine's needs."""
        return load_transformers_tokenizer(self.folder)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or name in ("hf", "backend", "folder"):
            raise AttributeError(name)
        return getattr(self.hf, name)

    def __repr__(self) -> str:
        return f"FastTokenizer({str(self.folder)!r}, vocab={len(self)})"


class ByteTokenizer:
    """A byte-level tokenizer for `dummy:` targets, which have random weights and no tokenizer of their own.

    It gives benchmarks on dummy targets real prompts of realistic length: one token per UTF-8 byte.
    """

    chat_template = None

    def __init__(self, vocab_size: int, eos_token_ids: tuple[int, ...] = ()) -> None:
        if vocab_size < 260:
            raise ConfigError("a byte tokenizer needs a vocabulary of at least 260 tokens")
        self.vocab_size = vocab_size
        self.eos_token_id = eos_token_ids[0] if eos_token_ids else None
        self.offset = 4  # ids 0..3 stay free for special tokens (bos, eos, ...)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [b + self.offset for b in text.encode("utf-8")]

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        data = bytes(i - self.offset for i in ids if self.offset <= i < 256 + self.offset)
        return data.decode("utf-8", errors="replace")

    def __len__(self) -> int:
        return self.vocab_size


def _token_text(value: Any) -> str:
    """A special token as tokenizer_config.json stores it: a string, or an AddedToken dict."""
    return value["content"] if isinstance(value, dict) else str(value)


def _chat_template(folder: Path, config: dict[str, Any]) -> str | None | bool:
    """The folder's chat template; False when it is one transformers alone handles (a list of named ones)."""
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    template = config.get("chat_template")
    if template is None or isinstance(template, str):
        return template
    return False


def _clean_up_tokenization(text: str) -> str:
    for before, after in ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
                          (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re")):
        text = text.replace(before, after)
    return text
