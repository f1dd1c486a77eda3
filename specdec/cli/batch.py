"""Batch mode of `specdec generate --prompts-file in.jsonl [--output out.jsonl]`: many requests through the
continuous-batching loop, with nothing lost.

* Everything that can be checked is checked before the model loads: the prompts file exists and reads, the
  output path is writable (a missing parent folder is created), an output holding results is neither
  overwritten by accident nor appended to without `--resume`.
* Each result is appended to the output (or stdout) as one JSON line the moment its request finishes, in one
  write, flushed, so Ctrl-C, SIGTERM or SIGKILL keeps every finished record; lines come in finishing order
  (sort by "index" for file order).
* `--resume` reads the output back (dropping a half-written last line), and runs only the records it lacks.
* A malformed line, or a prompt the model cannot take (too long, bad text), becomes an error record
  (`{"index", "line", "error"}`) while the other records run; the exit code is then 1.
* Progress and the summary go to stderr; stdout carries only JSONL.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from specdec.cli.common import EXIT_INTERRUPTED, EXIT_PARTIAL, cli_message, err_console, fail, note
from specdec.cli.records import output_record
from specdec.errors import ConfigError, SpecdecError


@dataclass(frozen=True)
class Item:
    """One line of the prompts file."""

    index: int  # position among the file's records (blank lines skipped), 0-based
    line: int  # 1-based line number
    record: dict | None  # None for a malformed line
    error: str | None = None

    @property
    def key(self) -> tuple[str, Any]:
        """What --resume matches on: the record's own "id" when it has one, else its index."""
        if self.record is not None and "id" in self.record:
            return ("id", self.record["id"])
        return ("index", self.index)


@dataclass
class BatchJob:
    prompts_file: Path
    output: Path | None  # None: stdout
    items: list[Item]
    done: set = field(default_factory=set)  # keys of the records already in the output (--resume)

    @property
    def todo(self) -> list[Item]:
        return [item for item in self.items if item.key not in self.done]


def open_job(prompts_file: Path, output: Path | None, *, resume: bool, overwrite: bool) -> BatchJob:
    """Read the prompts and check the output before anything slow; with --resume, what is already done."""
    from specdec.data import scan_prompts

    items = [Item(i, line, record, None if error is None else str(error))
             for i, (line, record, error) in enumerate(scan_prompts(prompts_file))]
    if not items:
        raise ConfigError(f"{prompts_file} holds no prompts (one JSON object with a \"prompt\" per line)")
    job = BatchJob(prompts_file, output, items)
    if output is None:
        if resume or overwrite:
            raise ConfigError("--resume and --overwrite need --output (a results file)")
        return job
    if resume and overwrite:
        raise ConfigError("give --resume (keep the results in --output) or --overwrite (replace them), not both")
    job.done = _prepare_output(Path(output), Path(prompts_file), resume=resume, overwrite=overwrite)
    return job


def _prepare_output(output: Path, prompts_file: Path, *, resume: bool, overwrite: bool) -> set:
    if output.is_dir():
        raise ConfigError(f"--output {output} is a folder; give a file path such as {output / 'results.jsonl'}")
    if output.resolve() == prompts_file.resolve():
        raise ConfigError(f"--output {output} is the prompts file itself; write the results elsewhere")
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"cannot create the folder of --output {output}: {exc.strerror or exc}") from None
    existing = output.is_file() and output.stat().st_size > 0
    done: set = set()
    if existing and resume:
        done = _read_done(output)
    elif existing and not overwrite:
        n = sum(1 for _ in _nonblank_lines(output))
        raise ConfigError(f"--output {output} already holds {n} result line(s); pass --resume to run only the "
                          "prompts it lacks, or --overwrite to start again")
    try:  # prove the path writable now, not after generating everything
        with output.open("ab" if resume else "wb"):
            pass
    except OSError as exc:
        raise ConfigError(f"cannot write --output {output}: {exc.strerror or exc}") from None
    return done


def _nonblank_lines(path: Path) -> Iterator[bytes]:
    with path.open("rb") as f:
        for raw in f:
            if raw.strip():
                yield raw


def _read_done(output: Path) -> set:
    """Keys of the records in an output file. A last line cut off by a kill is dropped from the file."""
    data = output.read_bytes()
    if not data.endswith(b"\n"):
        cut = data.rfind(b"\n") + 1
        with output.open("r+b") as f:
            f.truncate(cut)
        if data[cut:].strip():
            note(f"dropped a half-written last line from {output} (its prompt runs again)")
        data = data[:cut]
    done = set()
    for lineno, raw in enumerate(data.splitlines(), 1):
        if not raw.strip():
            continue
        try:
            record = json.loads(raw)
            key = ("id", record["id"]) if "id" in record else ("index", int(record["index"]))
        except (ValueError, KeyError, TypeError):
            raise ConfigError(f"--resume cannot read line {lineno} of {output} (not a result record); fix or "
                              "delete that line, or pass --overwrite to start again") from None
        done.add(key)
    return done


class RecordWriter:
    """Appends one JSON line per record with a single unbuffered write, SIGINT held off for its duration, so
    a record is either wholly in the file or not at all (a SIGKILL mid-write leaves a cut line, which
    --resume drops)."""

    def __init__(self, output: Path | None) -> None:
        self.fd = sys.stdout.fileno() if output is None else os.open(output, os.O_WRONLY | os.O_APPEND | os.O_CREAT,
                                                                      0o644)
        self.owned = output is not None
        if output is None:
            sys.stdout.flush()
        self.count = 0

    def write(self, record: dict) -> None:
        try:
            line = json.dumps(record, ensure_ascii=False) + "\n"
            data = line.encode("utf-8")
        except UnicodeEncodeError:  # a prompt holding lone surrogates: escape them
            data = (json.dumps(record) + "\n").encode("ascii")
        with _sigint_held():
            view = memoryview(data)
            while view:
                view = view[os.write(self.fd, view):]
        self.count += 1

    def close(self) -> None:
        if self.owned:
            os.close(self.fd)


@contextmanager
def _sigint_held() -> Iterator[None]:
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def run_batch(llm: Any, job: BatchJob, params: Any, chat: bool) -> int:
    """Run every record not yet done; returns the exit code (0, 1 if some records failed, 130 if interrupted)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    todo = job.todo
    where = str(job.output) if job.output is not None else "stdout"
    if len(todo) < len(job.items):
        note(f"--resume: {len(job.items) - len(todo)} of {len(job.items)} records already in {where}")
    writer = RecordWriter(job.output)
    failed = 0
    runnable: list[tuple[Item, list[int]]] = []
    for item in todo:
        if item.error is not None:
            writer.write(_error_record(item, item.error))
            failed += 1
            continue
        try:
            runnable.append((item, llm.check(item.record["prompt"], params, chat)))
        except SpecdecError as exc:
            writer.write(_error_record(item, cli_message(str(exc))))
            failed += 1
    generated = steps = cached = finished = 0
    start = time.perf_counter()
    columns = (TextColumn("[bold]generating"), BarColumn(), MofNCompleteColumn(),
               TextColumn("{task.fields[rate]:.1f} tok/s  tau {task.fields[tau]:.2f}  "
                          "prefix cache {task.fields[cached]} tok"), TimeElapsedColumn())
    previous_term = signal.signal(signal.SIGTERM, _interrupt)
    try:
        with Progress(*columns, console=err_console, transient=False, disable=not runnable) as progress:
            task = progress.add_task("requests", total=len(runnable), rate=0.0, tau=0.0, cached=0)
            if runnable:
                for delta in llm.stream([ids for _, ids in runnable], params, chat=False):
                    generated += len(delta.token_ids)
                    steps += 1 if delta.token_ids else 0
                    if delta.finished and delta.output is not None:
                        item, _ = runnable[delta.index]
                        writer.write(_result_record(item, delta.output))
                        cached += delta.output.metrics.cached_prompt_tokens
                        finished += 1
                        progress.advance(task)
                    elapsed = max(time.perf_counter() - start, 1e-9)
                    progress.update(task, rate=generated / elapsed, tau=generated / max(steps, 1), cached=cached)
    except KeyboardInterrupt:
        note(f"interrupted: {finished} of {len(runnable)} results written to {where}; "
             + ("run the same command with --resume to finish the rest" if job.output is not None
                else "use --output FILE to be able to --resume"))
        return EXIT_INTERRUPTED
    except SpecdecError as exc:
        note(f"{finished} of {len(runnable)} results written to {where} before the error"
             + ("; fix it and run the same command with --resume" if job.output is not None else ""))
        fail(str(exc))
    finally:
        signal.signal(signal.SIGTERM, previous_term)
        writer.close()
    elapsed = time.perf_counter() - start
    note(f"wrote {finished} result(s) to {where} in {elapsed:.1f} s ({generated / max(elapsed, 1e-9):.1f} tok/s)"
         + (f"; {failed} record(s) failed, see their \"error\"" if failed else ""))
    return EXIT_PARTIAL if failed else 0


def _base(item: Item) -> dict:
    record: dict[str, Any] = {"index": item.index, "line": item.line}
    if item.record is not None:
        if "id" in item.record:
            record["id"] = item.record["id"]
        record["prompt"] = item.record["prompt"]
    return record


def _error_record(item: Item, message: str) -> dict:
    return {**_base(item), "error": message}


def _result_record(item: Item, out: Any) -> dict:
    return {**_base(item), **output_record(out)}
