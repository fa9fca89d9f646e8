"""What the Pallas Triton quantizers compile to for sm_90, counted on a host without a GPU.

    python -m experiments.bench triton-isa --triton-python PYTHON [--dtypes float32,bfloat16]
        [--tilings 16x2,32x4,64x4,64x8] [--out FILE]

Pallas lowers each kernel (RTN; RHT + SR along each axis) to Triton IR here, under
`kernels._platform.assume_hopper` as the tests do. PYTHON, an interpreter with the `triton`
package installed (`pip install triton`, kept out of the project's environment: XLA embeds its own
Triton, so its version may differ), compiles that IR for cuda:90 the way XLA's Triton does, and
counts per kernel: layout conversions in the TTGIR (each a shuffle or a shared-memory round trip),
shared memory, registers and spill bytes (`ptxas -v`), and SASS instructions by class
(`cuobjdump -sass`; CALL counts the slow paths of the correctly rounded division). Counts explain
a kernel's time on the GPU; they are not a time.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from experiments.bench.timing import commit_id, write_result

DEFAULT_TILINGS = ((16, 2), (32, 4), (64, 4), (64, 8))
SHAPE = (1024, 512)

# Runs in PYTHON (no jax there): compiles each TTIR file and prints one JSON object per kernel.
_COMPILE = r'''
import collections, json, re, subprocess, sys
from pathlib import Path
import triton
from triton.backends.compiler import GPUTarget
nvbin = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
for job in json.loads(sys.argv[1]):
  k = triton.compile(job["ttir"], target=GPUTarget("cuda", 90, 32),
                     options=dict(num_warps=job["num_warps"], num_stages=1))
  ptx, cubin = Path(job["ttir"]).with_suffix(".ptx"), Path(job["ttir"]).with_suffix(".cubin")
  ptx.write_text(k.asm["ptx"]); cubin.write_bytes(k.asm["cubin"])
  for ptxas in (nvbin / "ptxas-blackwell", nvbin / "ptxas"):  # the newest first: it reads the PTX version Triton writes
    info = subprocess.run([str(ptxas), "-v", "--gpu-name=sm_90a", str(ptx), "-o", "/dev/null"],
                          capture_output=True, text=True).stderr
    if "Used" in info:
      break
  sass = subprocess.run([str(nvbin / "cuobjdump"), "-sass", str(cubin)], capture_output=True, text=True).stdout
  ops = collections.Counter(re.findall(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_]+)", sass))
  spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", info)
  print(json.dumps(dict(
      name=job["name"], triton=triton.__version__, convert_layouts=k.asm["ttgir"].count("ttg.convert_layout"),
      shared_bytes=k.metadata.shared, registers=int(re.search(r"Used (\d+) registers", info).group(1)),
      spill_bytes=int(spill.group(1)) + int(spill.group(2)) if spill else 0, sass=sum(ops.values()),
      sass_by_class={c: ops[c] for c in ("LDG", "STG", "LDS", "STS", "SHFL", "BAR", "MUFU", "CALL", "FFMA")})))
'''


def kernel_cases(dtypes: list[str], tilings) -> list[tuple[str, object, int, int]]:
  """(name, fn of x, num_warps, elements per thread) for each kernel, dtype and tiling."""
  import jax.numpy as jnp  # noqa: PLC0415

  from tetrajet_jax.kernels.nvfp4_quantize_triton import (  # noqa: PLC0415
      quantize_nvfp4_backward_triton, quantize_nvfp4_rtn_triton, requantize_nvfp4_backward_triton)
  from tetrajet_jax.numerics import quantize_nvfp4  # noqa: PLC0415

  signs, seed = jnp.ones((16,), jnp.float32), jnp.uint32(3)
  cases = []
  for dtype in dtypes:
    for rows, warps in tilings:
      per_thread = rows * 128 // (32 * warps)
      opts = dict(block_rows=rows, num_warps=warps)
      cases += [(f"triton rtn {dtype} rows{rows}_w{warps}",
                 lambda x, o=opts: quantize_nvfp4_rtn_triton(x, **o), warps, per_thread, dtype)]
      cases += [(f"triton rht+sr {dtype} axis={axis} rows{rows}_w{warps}",
                 lambda x, o=opts, a=axis: quantize_nvfp4_backward_triton(x, signs, seed, axis=a, **o), warps,
                 per_thread, dtype) for axis in (-1, 0)]
      if dtype == "float32":  # Q6 from Q1's codes (x only makes the codes: its dtype does not matter)
        cases += [(f"triton rht+sr from codes axis=0 rows{rows}_w{warps}",
                   lambda x, o=opts: requantize_nvfp4_backward_triton(quantize_nvfp4(x, axis=-1), signs, seed,
                                                                      rows=x.shape[0], **o), warps, per_thread,
                   dtype)]
  return cases


def lower_to_ttir(fn, spec) -> str:
  """The Triton IR Pallas lowers fn's one Triton kernel to, for sm_90 (the text of the module
  handed to XLA)."""
  import jax  # noqa: PLC0415
  from jax._src.pallas.triton import pallas_call_registration  # noqa: PLC0415

  from tetrajet_jax.kernels import _platform  # noqa: PLC0415

  lowering = pallas_call_registration.lowering
  original, captured = lowering.lower_jaxpr_to_triton_module, []

  def capture(*args, **kwargs):
    result = original(*args, **kwargs)
    captured.append(result.module.operation.get_asm())
    return result

  lowering.lower_jaxpr_to_triton_module = capture
  try:
    with _platform.assume_hopper():
      jax.jit(fn).trace(spec).lower(lowering_platforms=("cuda",))
  finally:
    lowering.lower_jaxpr_to_triton_module = original
  if len(captured) != 1:
    raise RuntimeError(f"expected one Triton kernel, lowered {len(captured)}")
  return captured[0]


def table(result: dict) -> str:
  lines = ["| kernel | SASS instructions per element (static) | layout conversions | shared B | registers | spill B "
           "| SHFL | BAR | CALL |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
  for r in result["rows"]:
    c = r["sass_by_class"]
    lines.append(f"| {r['name']} | {r['sass'] / r['elements_per_thread']:.0f} | {r['convert_layouts']} | "
                 f"{r['shared_bytes']} | {r['registers']} | {r['spill_bytes']} | {c['SHFL']} | {c['BAR']} | "
                 f"{c['CALL']} |")
  return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
  ap = argparse.ArgumentParser(prog="python -m experiments.bench triton-isa", description=__doc__.split("\n\n")[0])
  ap.add_argument("--triton-python", required=True,
                  help="an interpreter with the triton package (e.g. a separate venv's bin/python)")
  ap.add_argument("--dtypes", default="float32,bfloat16")
  ap.add_argument("--tilings", default=",".join(f"{r}x{w}" for r, w in DEFAULT_TILINGS),
                  help="rows per program x warps, comma-separated")
  ap.add_argument("--out", default="", help="write the result JSON here")
  args = ap.parse_args(argv)
  bad = [t for t in args.tilings.split(",") if not re.fullmatch(r"\d+x\d+", t)]
  if bad:
    ap.error(f"--tilings: {bad} are not ROWSxWARPS (e.g. 32x4)")
  import jax  # noqa: PLC0415

  tilings = [tuple(int(v) for v in t.split("x")) for t in args.tilings.split(",")]
  cases = kernel_cases(args.dtypes.split(","), tilings)
  with tempfile.TemporaryDirectory() as tmp:
    jobs, meta = [], {}
    for i, (name, fn, warps, per_thread, dtype) in enumerate(cases):
      path = Path(tmp) / f"k{i}.ttir"
      path.write_text(lower_to_ttir(fn, jax.ShapeDtypeStruct(SHAPE, dtype)))
      jobs.append(dict(name=name, ttir=str(path), num_warps=warps))
      meta[name] = per_thread
    env = os.environ | {"TRITON_DEFAULT_FP_FUSION": "1"}  # the default of Triton 3.9 and earlier, said explicitly
    out = subprocess.run([args.triton_python, "-c", _COMPILE, json.dumps(jobs)], capture_output=True, text=True,
                         env=env)
    if out.returncode:
      raise SystemExit(f"compiling with {args.triton_python} failed:\n{out.stderr[-3000:]}")
  rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
  rows = [r | {"elements_per_thread": meta[r["name"]]} for r in rows]
  result = dict(kind="triton_isa", commit=commit_id(), jax=jax.__version__, shape=list(SHAPE), target="cuda:90",
                rows=rows)
  print(f"Pallas Triton quantizers compiled for sm_90 (commit {result['commit']}, triton "
        f"{rows[0]['triton'] if rows else '?'}), per program tile:")
  print(table(result))
  write_result(args.out, result)
  return result


if __name__ == "__main__":
  main(sys.argv[1:])
