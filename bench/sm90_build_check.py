"""Build the Triton kernels for sm_90 (H100/H200) on a machine WITHOUT a GPU; report registers, spills, shared
memory and the matrix instructions used. Exit 1 if any configuration spills to local memory.

    python bench/sm90_build_check.py            # the launch configurations attention.py picks, 3 head dims
    python bench/sm90_build_check.py --quick    # head_dim 128 only

Why: the tests run the kernels in the Triton interpreter, which accepts programs the compiler rejects and says
nothing about registers. This compiles each configuration the heuristics choose, with the divisibility hints
the JIT adds at launch (16-byte aligned pointers, strides divisible by 16: without them loads are not
vectorised and the counts are meaningless), using the ptxas and cuobjdump shipped in the triton wheel.
"""

from __future__ import annotations

import argparse
import inspect
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from specdec.kernels.triton import attention as attn  # noqa: E402
from specdec.kernels.triton import kv_ops  # noqa: E402

TARGET = GPUTarget("cuda", 90, 32)
CUOBJDUMP = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
POINTERS = {"block_tables": "*i32", "prefix_lens": "*i32", "query_start_loc": "*i32", "tree_mask": "*i32",
            "part_out": "*fp32", "part_max": "*fp32", "part_sum": "*fp32", "src_rows": "*i64", "dst_rows": "*i64"}  # fmt: skip
NOT_DIVISIBLE = {"stride_bt", "stride_mask", "num_seqs", "num_splits", "num_heads"}  # ints that are rarely 16k
# name: (new tokens per sequence, causal, split-K)
SCENARIOS = {"decode": (1, True, True), "tree8": (8, False, True), "tree128": (128, False, False),
             "prefill512": (512, True, False)}  # fmt: skip


def build(fn, dtype: str, constexprs: dict, num_warps: int) -> dict:
    """Compile `fn` for sm_90 and read its resource usage off the cubin."""
    names = list(inspect.signature(fn.fn).parameters)
    signature, attrs = {}, {}
    for i, name in enumerate(names):
        if name in constexprs:
            signature[name] = "constexpr"
            continue
        is_float_buffer = name in ("q", "k_cache", "v_cache", "out", "src_k", "src_v", "dst_k", "dst_v")
        signature[name] = f"*{dtype}" if is_float_buffer else POINTERS.get(name, "fp32" if name == "scale_log2" else "i32")
        if signature[name].startswith("*") or (signature[name] == "i32" and name not in NOT_DIVISIBLE):
            attrs[(i,)] = [["tt.divisibility", 16]]
    kernel = triton.compile(ASTSource(fn, signature, constexprs, attrs), target=TARGET,
                            options={"num_warps": num_warps, "num_stages": 2})  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        cubin = os.path.join(tmp, "k.cubin")
        Path(cubin).write_bytes(kernel.asm["cubin"])
        usage = subprocess.run([CUOBJDUMP, "--dump-resource-usage", cubin], capture_output=True, text=True).stdout
        sass = subprocess.run([CUOBJDUMP, "--dump-sass", cubin], capture_output=True, text=True).stdout
    regs, stack = re.search(r"REG:(\d+).*?STACK:(\d+)", usage).groups()
    mma = "wgmma" if "HGMMA" in sass else "mma" if "HMMA" in sass else "fma"
    return {"regs": int(regs), "stack": int(stack), "spills": sass.count("STL"), "smem": kernel.metadata.shared,
            "mma": mma, "warps": num_warps}  # fmt: skip


def attention_configs(head_dims: tuple[int, ...]):
    """(label, dtype, constexprs, warps) as `attention.attention` would launch them for llama-like GQA 4."""
    for dtype in ("bf16", "fp32"):
        for head_dim in head_dims:
            for name, (per_seq, causal, split) in SCENARIOS.items():
                fp32 = dtype == "fp32"
                rows, keys = attn._tile_shape(per_seq * 8, 8, 4, head_dim, fp32)
                consts = dict(PAGE=16, GROUP=4, HEAD_DIM=head_dim, BLOCK_D=head_dim, BLOCK_M=rows, BLOCK_N=keys,
                              CAUSAL=causal, SPLIT=split, MIN_CHUNK=256, DOT_PRECISION="ieee" if fp32 else "tf32")  # fmt: skip
                yield f"attention {name} D={head_dim} M={rows} N={keys}", dtype, consts, attn._num_warps(rows, head_dim, fp32)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="head_dim 128 only")
    head_dims = (128,) if parser.parse_args().quick else (64, 128, 256)
    configs = list(attention_configs(head_dims))
    configs.append(("combine splits<=64 D=128", "bf16", dict(SPLITS_POW2=64, HEAD_DIM=128, BLOCK_D=128), 4))
    configs.append(("copy_rows D=128", "bf16", dict(HEAD_DIM=128, BLOCK_H=8, BLOCK_D=128, SRC_IDENTITY=True,
                                                    DST_IDENTITY=False), 4))  # fmt: skip
    kernels = {"attention": attn._attention_kernel, "combine": attn._combine_kernel, "copy_rows": kv_ops._copy_rows_kernel}
    spilled = 0
    print(f"{'config':44} dtype regs stack spills   smem  mma   warps")
    for label, dtype, consts, warps in configs:
        r = build(kernels[label.split()[0]], dtype, consts, warps)
        spilled += r["spills"] > 0
        print(f"{label:44} {dtype:5} {r['regs']:4} {r['stack']:5} {r['spills']:6} {r['smem']:6}  {r['mma']:5} {r['warps']}", flush=True)
    print(f"{len(configs)} configurations, {spilled} with spills")
    return 1 if spilled else 0


if __name__ == "__main__":
    sys.exit(main())
