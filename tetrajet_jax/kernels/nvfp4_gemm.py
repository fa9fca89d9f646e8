"""Exact NVFP4 GEMM on Hopper: bf16 wgmma per 128-wide K chunk, FP32 promotion.

Math (docs/SPEC.md section 1, exactness note). For operands quantized along K with
1x16 E4M3 inner scales inside 1x128 FP32 outer scales,

  out[m, n] = sum_c  (sum_{k in chunk c} qa[m,k] * qb[n,k]) * (sa[m,c] * sb[n,c])

where qa = q * s_in is exact in bf16. The kernel runs bf16 wgmma over each
128-wide chunk into a fresh FP32 accumulator, multiplies that partial by the
FP32 product sa[m,c] * sb[n,c] and adds it to the running FP32 sum
("promotion", as in the reference SM120 kernel). The only roundings are FP32
accumulation order and the final cast to out_dtype.

Design (the "operand" design): the exact bf16
operand q * s_in is materialized (by `nvfp4_bf16_operand`, or fused in the
quantizer kernel) and the GEMM streams bf16 tiles through TMA. Warp-specialized
pipeline: one memory warpgroup issues TMA loads of A [tm, 128], B [2 tn, 128]
and the per-chunk scale rows, two compute warpgroups each own a [tm, tn]
output tile. Persistent grid over the output tiles (one CTA per SM).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.experimental.pallas as pl
import jax.experimental.pallas.mosaic_gpu as plgpu
import jax.numpy as jnp
from jax import lax

from tetrajet_jax.kernels import _platform
from tetrajet_jax.numerics import NVFP4Operand, NVFP4Tensor, dequantize_nvfp4_canonical, nvfp4_bf16_operand
from tetrajet_jax.numerics.nvfp4 import OUTER_BLOCK

CHUNK_K = OUTER_BLOCK  # one FP32 outer block along K: the promotion interval
_SMEM_BYTES = 227 * 1024


@dataclasses.dataclass(frozen=True, kw_only=True)
class GemmConfig:
  """Tiling of the block-scaled bf16 GEMM.

  Attributes:
    tile_m: rows of the output tile of one compute warpgroup (multiple of 64).
    tile_n: columns of the output tile of one compute warpgroup (multiple of 64).
    max_concurrent_steps: TMA pipeline depth (K steps in flight).
    k_step: K elements per pipeline step: 128 (one chunk, promoted once) or 64
      (half a chunk: twice the steps in flight for the same SMEM, each step's
      partial promoted with its chunk's scales, which changes only the FP32
      summation order).
    epi_tile_m, epi_tile_n: epilogue sub-tile written through SMEM per TMA store.
    grid_tile_width: width of the planar snake over output tiles (L2 reuse).
    out_slots: epilogue SMEM buffers per warpgroup (2 overlaps TMA stores).
    cluster_m: run CTAs in pairs (a 2-CTA cluster) on vertically adjacent output
      tiles, which share every B tile and its scales: one TMA load multicast to
      both, so each CTA fetches 3/4 of the operand bytes per K chunk of a lone
      CTA (M must then be a multiple of 2 tile_m).
    mma_rows: rows of one wgmma and its promotion (a multiple of 64 dividing tile_m; default
      tile_m). Below tile_m, a warpgroup runs its tile as tile_m / mma_rows wgmmas per step, each
      promoted before the next starts, so the FP32 partial it holds besides the running sum is
      [mma_rows, tile_n]: a 128 x 128 warpgroup tile (wgmma N = 128, which reads 3/4 of the
      shared-memory bytes per FLOP of N = 64) fits the registers with mma_rows=64. The sums and
      their order are those of one wgmma over the tile.
    overlap_promotion: promote each step's partial while the next step's wgmma runs instead of
      before it is issued, so the tensor cores do not idle through the promotion. The partial and
      its scales wait in registers for one step (a second [tile_m, tile_n] FP32 partial beside the
      wgmma's accumulator and the running sum: one row group only). Same sums, same order.
  """

  tile_m: int = 128
  tile_n: int = 64
  max_concurrent_steps: int = 2
  out_slots: int = 2
  epi_tile_m: int = 64
  epi_tile_n: int = 64
  grid_tile_width: int = 8
  cluster_m: bool = False
  k_step: int = CHUNK_K
  mma_rows: int | None = None
  overlap_promotion: bool = False

  def __post_init__(self):
    if self.tile_m % 64 or self.tile_n % 64:
      raise ValueError(f"GemmConfig: tile_m={self.tile_m}, tile_n={self.tile_n} must be multiples of 64 "
                       "(wgmma M granularity and the 128-byte swizzle).")
    if self.tile_m % self.epi_tile_m or self.tile_n % self.epi_tile_n:
      raise ValueError(f"GemmConfig: epilogue tile ({self.epi_tile_m}, {self.epi_tile_n}) must divide "
                       f"the warpgroup tile ({self.tile_m}, {self.tile_n}).")
    if self.out_slots not in (1, 2):
      raise ValueError(f"GemmConfig: out_slots={self.out_slots} must be 1 or 2.")
    if self.k_step not in (CHUNK_K, CHUNK_K // 2):
      raise ValueError(f"GemmConfig: k_step={self.k_step} must be {CHUNK_K} or {CHUNK_K // 2} (a promotion chunk or "
                       "half of one).")
    if self.mma_rows is not None and (self.mma_rows % 64 or self.tile_m % self.mma_rows
                                      or self.mma_rows % self.epi_tile_m):
      raise ValueError(f"GemmConfig: mma_rows={self.mma_rows} must be a multiple of 64 that divides "
                       f"tile_m={self.tile_m} and is a multiple of epi_tile_m={self.epi_tile_m}.")
    if self.overlap_promotion and self.mma_m != self.tile_m:
      raise ValueError(f"GemmConfig: overlap_promotion needs one row group (mma_rows=None or {self.tile_m}), got "
                       f"mma_rows={self.mma_rows}: a second partial per group does not fit the registers.")
    if self.max_concurrent_steps < 1:
      raise ValueError(f"GemmConfig: max_concurrent_steps={self.max_concurrent_steps} must be >= 1.")

  @property
  def mma_m(self) -> int:
    """Rows of one wgmma and its promotion."""
    return self.mma_rows or self.tile_m

  @property
  def cta_tile_m(self) -> int:
    return self.tile_m

  @property
  def cta_tile_n(self) -> int:
    return 2 * self.tile_n  # two compute warpgroups side by side along N

  @property
  def cluster_size(self) -> int:
    return 2 if self.cluster_m else 1

  @property
  def rows_multiple(self) -> int:
    """What M must be a multiple of: the output rows one cluster covers."""
    return self.cluster_size * self.cta_tile_m

  def tiles(self, m: int, n: int) -> bool:
    """Whether an [m, n] output is whole cluster tiles of this config."""
    return m % self.rows_multiple == 0 and n % self.cta_tile_n == 0

  def smem_bytes(self, out_itemsize: int = 2) -> int:
    stage = (self.cta_tile_m + self.cta_tile_n) * self.k_step * 2 + (self.cta_tile_m + self.cta_tile_n) * 4
    out = 2 * self.out_slots * self.epi_tile_m * self.epi_tile_n * out_itemsize
    # Measured on the H200 (run 1, notes/kernels.md): Mosaic allocates ~33 KiB
    # more than the buffers above (pipeline/barrier/alignment scratch).
    return self.max_concurrent_steps * stage + out + 34 * 1024


DEFAULT_CONFIG = GemmConfig()
# Wider wgmmas (N = 128) in 64-row groups; CTA tile 128 x 256 (TETRAJET_GEMM_TILING=wide).
WIDE_CONFIG = GemmConfig(tile_n=128, k_step=CHUNK_K // 2, max_concurrent_steps=3, mma_rows=64)
# The default tiles, each partial promoted while the next wgmma runs (TETRAJET_GEMM_TILING=overlap).
OVERLAP_CONFIG = GemmConfig(overlap_promotion=True)


def layer_gemm_config(m: int, n: int) -> GemmConfig:
  """The tiling of the layer's [m, n] output (`_platform.GEMM_TILING`): under "wide" WIDE_CONFIG
  where it tiles [m, n], under "overlap" OVERLAP_CONFIG, else DEFAULT_CONFIG."""
  tiling = _platform.gemm_tiling()
  if tiling == "wide" and WIDE_CONFIG.tiles(m, n):
    return WIDE_CONFIG
  return OVERLAP_CONFIG if tiling == "overlap" else DEFAULT_CONFIG


def _promote(acc: jax.Array, part: jax.Array, sa: jax.Array, sb: jax.Array) -> jax.Array:
  """The running sum plus one step's wgmma partial times its outer scales sa[m] * sb[n]."""
  shape = part.shape
  return acc + part * (lax.broadcast_in_dim(sa, shape, [0]) * lax.broadcast_in_dim(sb, shape, [1]))


def _gemm_kernel(a_gmem, b_gmem, sa_gmem, sb_gmem, out_gmem, *, cfg: GemmConfig, k_splits: int):
  """Refs: a [M, Kp] bf16, b [N, Kp] bf16, sa [Kp/128, M] f32, sb [Kp/128, N] f32, out [k_splits, M, N]
  (split s holds the sum over its K chunks)."""
  m, kp = a_gmem.shape
  n = b_gmem.shape[0]
  out_dtype = out_gmem.dtype
  tm, tn, mm = cfg.tile_m, cfg.tile_n, cfg.mma_m
  cta_m, cta_n = cfg.cta_tile_m, cfg.cta_tile_n
  m_iters, n_iters = m // cfg.rows_multiple, n // cta_n  # output tiles of one cluster
  k_iters = kp // CHUNK_K // k_splits  # K chunks per work item
  steps_per_chunk = CHUNK_K // cfg.k_step
  epi_m, epi_n = cfg.epi_tile_m, cfg.epi_tile_n
  ab_transforms = _platform.swizzled(jnp.bfloat16, cfg.k_step)
  shared_b = ("cluster",) if cfg.cluster_m else ()  # B tiles multicast to both CTAs of a cluster

  def get_pipeline(body, compute_context):
    return plgpu.emit_pipeline_warp_specialized(
        body,
        grid=(k_iters * steps_per_chunk,),
        memory_registers=40,
        in_specs=[
            plgpu.BlockSpec((cta_m, cfg.k_step), lambda k: (0, k), transforms=ab_transforms,
                            memory_space=plgpu.SMEM),
            plgpu.BlockSpec((cta_n, cfg.k_step), lambda k: (0, k), transforms=ab_transforms,
                            memory_space=plgpu.SMEM, collective_axes=shared_b),
            plgpu.BlockSpec((1, cta_m), lambda k: (k // steps_per_chunk, 0), memory_space=plgpu.SMEM),
            plgpu.BlockSpec((1, cta_n), lambda k: (k // steps_per_chunk, 0), memory_space=plgpu.SMEM,
                            collective_axes=shared_b),
        ],
        wg_axis="wg",
        num_compute_wgs=2,
        max_concurrent_steps=cfg.max_concurrent_steps,
        compute_context=compute_context,
    )

  ignore = lambda *_, **__: None

  @functools.partial(
      pl.run_scoped,
      allocs=get_pipeline(ignore, ignore).get_allocations(a_gmem, b_gmem, sa_gmem, sb_gmem),
      out_smem=plgpu.SMEM((2, cfg.out_slots, epi_m, epi_n), out_dtype, transforms=_platform.swizzled(out_dtype, epi_n)),
      collective_axes="wg",
  )
  def _scope(allocs, out_smem):
    wg = lax.axis_index("wg")

    @plgpu.nd_loop((m_iters * n_iters * k_splits,), collective_axes="cluster_grid")
    def _tile_loop(info: plgpu.NDLoopInfo):
      (lin,) = info.index
      split, tile = lin // (m_iters * n_iters), lax.rem(lin, m_iters * n_iters)
      mi, ni = plgpu.planar_snake(tile, (m_iters, n_iters), 1, cfg.grid_tile_width)
      mi = mi * cfg.cluster_size + lax.axis_index("cluster")
      k_sl = pl.ds(split * k_iters * CHUNK_K, k_iters * CHUNK_K)
      chunk_sl = pl.ds(split * k_iters, k_iters)
      cta_m_sl = pl.ds(mi * cta_m, cta_m)
      cta_n_sl = pl.ds(ni * cta_n, cta_n)
      wg_n_sl = pl.ds(wg * tn, tn)

      def compute_context(run_pipeline):
        acc0 = tuple(plgpu.layout_cast(jnp.zeros((mm, tn), jnp.float32), plgpu.Layout.WGMMA)
                     for _ in range(tm // mm))
        if cfg.overlap_promotion:  # the first step promotes a zero partial with zero scales
          pending0 = (acc0[0], plgpu.layout_cast(jnp.zeros((tm,), jnp.float32), plgpu.Layout.WGMMA.reduce(1)),
                      plgpu.layout_cast(jnp.zeros((tn,), jnp.float32), plgpu.Layout.WGMMA.reduce(0)))
          (acc,), pending = run_pipeline((acc0, pending0))
          sums = (_promote(acc, *pending),)  # the last step's partial
        else:
          sums = run_pipeline(acc0)
        outs = [acc.astype(out_dtype) for acc in sums]  # running sums of row groups
        plgpu.wait_smem_to_gmem(0, wait_read_only=True)
        for ei in range(tm // epi_m):
          group, row = divmod(ei * epi_m, mm)
          for ej in range(tn // epi_n):
            slot = (ei * (tn // epi_n) + ej) % cfg.out_slots
            e_m = slice(ei * epi_m, (ei + 1) * epi_m)
            e_n = slice(ej * epi_n, (ej + 1) * epi_n)
            plgpu.wait_smem_to_gmem(cfg.out_slots - 1, wait_read_only=True)
            out_smem[wg, slot] = outs[group][row:row + epi_m, e_n]
            plgpu.commit_smem()
            plgpu.copy_smem_to_gmem(
                out_smem.at[wg, slot],
                out_gmem.at[split].at[cta_m_sl, cta_n_sl].at[:, wg_n_sl].at[e_m, e_n])

      def chunk_body(_, a_smem, b_smem, sa_smem, sb_smem, carry):
        sb = plgpu.load(sb_smem.at[0, wg_n_sl], layout=plgpu.Layout.WGMMA.reduce(0))  # [tn]
        b_t = b_smem.at[wg_n_sl].transpose((1, 0))
        if cfg.overlap_promotion:
          (acc,), pending = carry

          def mma_overlapped(acc_ref):
            plgpu.wgmma(acc_ref, a_smem, b_t)
            promoted = _promote(acc, *pending)  # the previous step's partial, while this wgmma runs
            return promoted, acc_ref[...]  # waits for this wgmma
          acc, part = pl.run_scoped(mma_overlapped, plgpu.ACC((tm, tn), jnp.float32))
          sa = plgpu.load(sa_smem.at[0], layout=plgpu.Layout.WGMMA.reduce(1))  # [tm]
          return (acc,), (part, sa, sb)
        new = []
        for group, acc in enumerate(carry):  # one wgmma and promotion per row group, in turn
          rows = pl.ds(group * mm, mm)

          def mma(acc_ref, rows=rows):
            plgpu.wgmma(acc_ref, a_smem.at[rows], b_t)
            return acc_ref[...]  # waits for this wgmma
          part = pl.run_scoped(mma, plgpu.ACC((mm, tn), jnp.float32))
          sa = plgpu.load(sa_smem.at[0, rows], layout=plgpu.Layout.WGMMA.reduce(1))  # [mm]
          new.append(_promote(acc, part, sa, sb))
        return tuple(new)

      get_pipeline(chunk_body, compute_context)(
          a_gmem.at[cta_m_sl, k_sl], b_gmem.at[cta_n_sl, k_sl],
          sa_gmem.at[chunk_sl, cta_m_sl], sb_gmem.at[chunk_sl, cta_n_sl],
          allocations=allocs)

  plgpu.wait_smem_to_gmem(0, wait_read_only=True)


def _check_operands(a_qs, a_so, b_qs, b_so, cfg: GemmConfig, name: str):
  if a_qs.ndim != 2 or b_qs.ndim != 2:
    raise ValueError(f"{name}: operands must be 2-D [M, Kp] and [N, Kp], got {a_qs.shape} and {b_qs.shape}.")
  (m, kp), (n, kp_b) = a_qs.shape, b_qs.shape
  if kp != kp_b:
    raise ValueError(f"{name}: reduction lengths differ: a has Kp={kp}, b has Kp={kp_b}; quantize both "
                     "along their K axis (the canonical layout pads K to a multiple of 128).")
  if kp % CHUNK_K:
    raise ValueError(f"{name}: Kp={kp} is not a multiple of {CHUNK_K}; use the canonical (padded) layout.")
  if a_qs.dtype != jnp.bfloat16 or b_qs.dtype != jnp.bfloat16:
    raise ValueError(f"{name}: operands must be bfloat16 (exact q * s_in), got {a_qs.dtype}, {b_qs.dtype}.")
  if a_so.shape != (m, kp // CHUNK_K) or b_so.shape != (n, kp // CHUNK_K):
    raise ValueError(f"{name}: outer scales must be [M, Kp/128]={(m, kp // CHUNK_K)} and "
                     f"[N, Kp/128]={(n, kp // CHUNK_K)}, got {a_so.shape} and {b_so.shape}.")
  if not cfg.tiles(m, n):
    raise ValueError(f"{name}: M={m}, N={n} must be multiples of ({cfg.rows_multiple}, {cfg.cta_tile_n}), the CTA "
                     "tile (its rows times the CTAs of a cluster); pad them or use the XLA path "
                     "(can_use_pallas_gemm says which).")
  if cfg.smem_bytes() > _SMEM_BYTES:
    raise ValueError(f"{name}: config {cfg} needs {cfg.smem_bytes()} bytes of SMEM (> {_SMEM_BYTES}); "
                     "lower max_concurrent_steps or the tiles.")


# Split K only while every K part keeps at least this many 128-chunks in its pipeline.
_MIN_CHUNKS_PER_SPLIT = 4


def gemm_k_splits(m: int, n: int, kp: int, *, config: GemmConfig = DEFAULT_CONFIG, interpret: bool = False) -> int:
  """Parts the GEMM cuts K into: the most (a divisor of Kp/128) that keep every work item
  (output tile x K part) in one wave on the SMs, with >= 4 chunks per part; 1 when the output
  tiles alone fill the SMs. A weight gradient (small [K, N] output, K = tokens) otherwise runs
  on a handful of SMs: 384 x 384 is nine CTA tiles for 132 SMs."""
  tiles = (m // config.cta_tile_m) * (n // config.cta_tile_n)
  chunks = kp // CHUNK_K
  sms = _platform.num_sms(interpret)
  best = 1
  for s in range(2, chunks // _MIN_CHUNKS_PER_SPLIT + 1):
    if chunks % s == 0 and tiles * s <= sms:
      best = s
  return best


def block_scaled_bf16_gemm(a_qs: jax.Array, a_scale_outer: jax.Array, b_qs: jax.Array,
                           b_scale_outer: jax.Array, *, out_dtype=jnp.bfloat16,
                           config: GemmConfig = DEFAULT_CONFIG, k_splits: int | None = None,
                           interpret: bool = False) -> jax.Array:
  """out = sum_c (a_qs[:, c] @ b_qs[:, c]^T) * (a_so[:, c] outer b_so[:, c]), FP32 accumulation.

  Args:
    a_qs: bf16 [M, Kp], the exact q * s_in operand of A (canonical layout).
    a_scale_outer: f32 [M, Kp/128], or a scalar (tensor scaling).
    b_qs: bf16 [N, Kp].
    b_scale_outer: f32 [N, Kp/128], or a scalar.
    out_dtype: output dtype (bf16 or f32).
    config: tiling.
    k_splits: parts K is cut into (a divisor of Kp/128), each summed by its own
      work item into an FP32 partial that XLA adds up; default `gemm_k_splits`.
    interpret: run on the CPU in Mosaic GPU's interpreter.

  Returns:
    [M, N] in out_dtype.
  """
  m, kp = a_qs.shape
  n = b_qs.shape[0]
  a_so = jnp.broadcast_to(jnp.asarray(a_scale_outer, jnp.float32), (m, kp // CHUNK_K))
  b_so = jnp.broadcast_to(jnp.asarray(b_scale_outer, jnp.float32), (n, kp // CHUNK_K))
  _check_operands(a_qs, a_so, b_qs, b_so, config, "block_scaled_bf16_gemm")
  if k_splits is None:
    k_splits = gemm_k_splits(m, n, kp, config=config, interpret=interpret)
  if k_splits < 1 or (kp // CHUNK_K) % k_splits:
    raise ValueError(f"block_scaled_bf16_gemm: k_splits={k_splits} must be a positive divisor of the "
                     f"{kp // CHUNK_K} chunks of {CHUNK_K} along K.")
  part_dtype = out_dtype if k_splits == 1 else jnp.float32
  kernel = plgpu.kernel(
      functools.partial(_gemm_kernel, cfg=config, k_splits=k_splits),
      out_type=jax.ShapeDtypeStruct((k_splits, m, n), part_dtype),
      grid=(_platform.num_sms(interpret) // config.cluster_size,),
      grid_names=("cluster_grid",),
      cluster=(config.cluster_size,),
      cluster_names=("cluster",),
      num_threads=3,
      thread_name="wg",
      compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Warpgroup),
  )
  with _platform.interpret_context(interpret):
    # Scales transposed to [Kp/128, M]: one contiguous row per K chunk for TMA.
    parts = kernel(a_qs, b_qs, a_so.T, b_so.T)
  return parts[0] if k_splits == 1 else jnp.sum(parts, axis=0).astype(out_dtype)


def can_use_pallas_gemm(m: int, n: int, kp: int, *, config: GemmConfig = DEFAULT_CONFIG) -> bool:
  """True when the Pallas GEMM runs here (Hopper GPU) for [M, Kp] x [N, Kp]; else use XLA."""
  return (_platform.hopper_available() and config.tiles(m, n)
          and kp % CHUNK_K == 0 and kp > 0 and config.smem_bytes() <= _SMEM_BYTES)


def operand_rows_and_k(t: NVFP4Tensor | NVFP4Operand) -> tuple[int, int]:
  """(rows, padded K) of an operand's canonical layout."""
  if isinstance(t, NVFP4Operand):
    return t.values.shape[0], t.values.shape[-1]
  return t.codes.shape[0], 2 * t.codes.shape[-1]


def _check_nvfp4(t: NVFP4Tensor | NVFP4Operand, name: str, which: str):
  if not isinstance(t, (NVFP4Tensor, NVFP4Operand)):
    raise TypeError(f"{name}: {which} must be an NVFP4Tensor or NVFP4Operand, got {type(t).__name__}.")
  if len(t.shape) != 2:
    raise ValueError(f"{name}: {which} must be 2-D (canonical [rows, Kp]), got shape {t.shape}.")
  if isinstance(t, NVFP4Tensor) and t.block_2d:
    raise ValueError(f"{name}: {which} uses 16x16 blocks; this kernel takes 1x16 blocks along K "
                     "(quantize_nvfp4(x, axis=...) with block_2d=False).")


@_platform.one_lowering_per_instance("out_dtype", "config", "k_splits", "interpret")
def nvfp4_gemm(a: NVFP4Tensor | NVFP4Operand, b: NVFP4Tensor | NVFP4Operand, *,
               extra: tuple[jax.Array, jax.Array] | None = None, out_dtype=jnp.bfloat16,
               config: GemmConfig = DEFAULT_CONFIG, k_splits: int | None = None, interpret: bool = False) -> jax.Array:
  """a_hat @ b_hat^T in the canonical layout: C[i, j] = sum_k A[i, k] B[j, k].

  a and b are 2-D NVFP4Tensors, or NVFP4Operands (a quantizer kernel's bf16
  operand: no decode pass); their canonical layout (quantized axis moved
  last, padded to Kp) is the GEMM operand, so a = quantize_nvfp4(x, axis=-1)
  gives A = x [M, K], and quantize_nvfp4(y, axis=0) gives A = y^T. Exact
  products, FP32 accumulation, outer scales promoted once per 128-wide K
  chunk. Block scaling (1x16 E4M3 in 1x128 FP32) or tensor scaling (scalar
  outer scale), mixed freely. Padding of K is zeros and changes nothing.
  extra: (A2 [M, E], B2 [N, E]) with values exact in bf16 (MXFP8's e4m3 * 2^e):
  A2 @ B2^T joins the same FP32 sum as ceil(E / 128) more K chunks with outer
  scale 1, so C is rounded to out_dtype once (OutControl's outlier channels).
  k_splits: as in `block_scaled_bf16_gemm` (default: split K while the
  output tiles leave SMs idle).

  Returns:
    [rows(a), rows(b)] in out_dtype.
  """
  _check_nvfp4(a, "nvfp4_gemm", "a")
  _check_nvfp4(b, "nvfp4_gemm", "b")
  if operand_rows_and_k(a)[1] != operand_rows_and_k(b)[1]:
    raise ValueError(f"nvfp4_gemm: padded K differs: a {operand_rows_and_k(a)[1]}, b {operand_rows_and_k(b)[1]}; "
                     f"logical shapes {a.shape} (axis {a.axis}) and {b.shape} (axis {b.axis}) must share K.")
  a_qs, a_so = nvfp4_bf16_operand(a)
  b_qs, b_so = nvfp4_bf16_operand(b)
  if extra is not None:
    (a_qs, a_so), (b_qs, b_so) = (_with_extra_chunks(qs, so, x, which)
                                  for qs, so, x, which in ((a_qs, a_so, extra[0], "a"), (b_qs, b_so, extra[1], "b")))
  return block_scaled_bf16_gemm(a_qs, a_so, b_qs, b_so, out_dtype=out_dtype, config=config, k_splits=k_splits,
                                interpret=interpret)


def _with_extra_chunks(qs: jax.Array, so: jax.Array, x: jax.Array, which: str) -> tuple[jax.Array, jax.Array]:
  """The operand with x appended along K (zero-padded to a multiple of 128), outer scale 1."""
  rows = qs.shape[0]
  if x.ndim != 2 or x.shape[0] != rows or x.shape[1] == 0:
    raise ValueError(f"nvfp4_gemm: extra operand {which} must be [{rows}, E] with E > 0, got {x.shape}.")
  chunks = -(-x.shape[1] // CHUNK_K)
  x = jnp.pad(x.astype(jnp.bfloat16), ((0, 0), (0, chunks * CHUNK_K - x.shape[1])))
  so = jnp.broadcast_to(jnp.asarray(so, jnp.float32), (rows, qs.shape[1] // CHUNK_K))
  return (jnp.concatenate([qs, x], axis=1),
          jnp.concatenate([so, jnp.ones((rows, chunks), jnp.float32)], axis=1))


def can_use_nvfp4_gemm(a, b, *, config: GemmConfig = DEFAULT_CONFIG) -> bool:
  """True when nvfp4_gemm(a, b) runs here (Hopper GPU, supported operands and shapes)."""
  if not all(isinstance(t, (NVFP4Tensor, NVFP4Operand)) for t in (a, b)):
    return False
  if len(a.shape) != 2 or len(b.shape) != 2 or any(getattr(t, "block_2d", False) for t in (a, b)):
    return False
  (m, kp), (n, kp_b) = operand_rows_and_k(a), operand_rows_and_k(b)
  return kp == kp_b and can_use_pallas_gemm(m, n, kp, config=config)


def nvfp4_gemm_reference(a: NVFP4Tensor, b: NVFP4Tensor, *, dtype=jnp.float32) -> jax.Array:
  """XLA reference: dequantize both to `dtype` and multiply at HIGHEST precision."""
  a_hat = dequantize_nvfp4_canonical(a, dtype)
  b_hat = dequantize_nvfp4_canonical(b, dtype)
  return jnp.dot(a_hat, b_hat.T, precision=lax.Precision.HIGHEST, preferred_element_type=dtype)
