/*
 * fvattn: video-attention kernels behind a stable C ABI.
 *
 *   - QAT attention: NVFP4 quantization-aware-training attention (FastVideo's Attn-QAT), forward and
 *     backward; with quantization off it is plain (dense) attention.
 *   - VSA: FastVideo's Video Sparse Attention, block-sparse attention over 64-token blocks, forward
 *     and backward, and the inversion of its block indices.
 *
 * How to use it, in four steps:
 *   1. fva_create() a handle (once; it picks the CUDA backend when a driver and a device are present,
 *      the CPU reference backend otherwise).
 *   2. Describe each tensor with an fva_tensor_t (data pointer, dtype, shape, strides in elements).
 *   3. Ask fva_*_workspace_size() how many bytes of scratch the call needs, pass that memory in.
 *   4. Call the operation. On failure it returns a status other than FVA_OK and fva_last_error()
 *      names the argument and the rule it broke; no output has been written.
 *
 * Conventions:
 *   - Attention tensors are rank 4, logically [B, H, S, D], with any strides whose last is 1 (BHSD and
 *     BSHD views both work). lse is rank 3 [B, H, S], float32. Strides count elements, not bytes,
 *     exactly like DLPack's DLTensor.
 *   - Data pointers are device pointers for a CUDA handle and host pointers for a CPU handle; so is
 *     the workspace pointer.
 *   - The stream is a cudaStream_t / CUstream passed as void* (NULL: the legacy default stream); the
 *     CPU backend ignores it and runs synchronously. No call synchronizes the device. A CUDA call
 *     launches in the calling thread's current context (the device's primary context when the
 *     thread has none); a current context of another device than the handle's, or a stream of
 *     another context, is refused with FVA_ERR_INVALID_ARGUMENT before any work.
 *   - Device pointers are not checked against allocations (no call could, without a sync): a
 *     freed or foreign pointer makes a kernel fault asynchronously. The call itself returns
 *     FVA_OK; the fault surfaces as the CUDA error of the caller's next synchronization, and as
 *     FVA_ERR_CUDA from every later fvattn call on that context (the driver's errors of that kind
 *     are sticky), never as a crash of the host process inside the library. A call's
 *     first kernel waits for the stream's earlier work as usual; on sm_90 and later devices with a
 *     CUDA 12.3+ driver its later kernels are programmatic dependent launches, each waiting for
 *     the one before it inside the call (the handle option chained_launches turns that off).
 *   - Every choice that changes what a call does or how much workspace it needs is an argument or a
 *     handle option fixed by fva_create; no call reads the environment.
 *   - No call allocates device memory; scratch comes from the caller (the workspace).
 *   - Every options struct starts with uint32_t struct_size and has an *_INIT initializer, so later
 *     versions can append fields without breaking callers compiled against this header.
 *   - A handle may be used from several threads at once. fva_last_error() is per thread.
 *
 * The numbers each operation computes are specified in docs/SPEC.md (FastVideo's behaviour).
 *
 * This header is C99, includes only <stddef.h> and <stdint.h>, and can be parsed by cffi after the
 * C preprocessor has run.
 */
#ifndef FVATTN_FVATTN_H_
#define FVATTN_FVATTN_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Exported from the library; empty for its users, so the header stays plain C for cffi. */
#if defined(FVATTN_BUILDING_LIBRARY) && defined(__GNUC__)
#define FVA_API __attribute__((visibility("default")))
#else
#define FVA_API
#endif

/* ---------------------------------------------------------------------------------------------- */
/* Version                                                                                         */
/* ---------------------------------------------------------------------------------------------- */

#define FVA_VERSION_MAJOR 0
#define FVA_VERSION_MINOR 1
#define FVA_VERSION_PATCH 0
/* The ABI version: bumped only when a change breaks binaries built against an older header. */
#define FVA_ABI_VERSION 1

/* The version of the loaded library, MAJOR*10000 + MINOR*100 + PATCH (compare with the macros to
 * detect a header/library mismatch). */
FVA_API int32_t fva_version(void);
/* The ABI version of the loaded library (FVA_ABI_VERSION of the header it was built from). */
FVA_API int32_t fva_abi_version(void);

/* ---------------------------------------------------------------------------------------------- */
/* Status                                                                                          */
/* ---------------------------------------------------------------------------------------------- */

typedef int32_t fva_status_t;
#define FVA_OK 0
#define FVA_ERR_INVALID_ARGUMENT 1    /* an argument broke a rule; fva_last_error() says which */
#define FVA_ERR_UNSUPPORTED 2         /* valid, but not supported by this build/backend/device */
#define FVA_ERR_WORKSPACE_TOO_SMALL 3 /* ws_bytes is below what the workspace query returned */
#define FVA_ERR_NO_DEVICE 4           /* CUDA requested, but no driver or no usable device */
#define FVA_ERR_CUDA 5                /* the CUDA driver reported an error */
#define FVA_ERR_OUT_OF_MEMORY 6       /* host memory ran out */
#define FVA_ERR_INTERNAL 7            /* a bug in fvattn: please report it with the message */

/* A static English name for a status ("FVA_ERR_INVALID_ARGUMENT"); "unknown status" for others. */
FVA_API const char* fva_status_string(fva_status_t status);
/* The message of the last failed call on the calling thread (e.g. "k: shape[2] is 300 but
 * v.shape[2] is 320"); "" if no call has failed on this thread. Valid until the next fvattn call on
 * this thread. Successful calls leave it unchanged. */
FVA_API const char* fva_last_error(void);

/* ---------------------------------------------------------------------------------------------- */
/* Tensors                                                                                         */
/* ---------------------------------------------------------------------------------------------- */

#define FVA_DTYPE_BF16 1
#define FVA_DTYPE_F16 2
#define FVA_DTYPE_F32 3
#define FVA_DTYPE_I32 4
#define FVA_DTYPE_I64 5

#define FVA_MAX_RANK 6

/* A strided view of memory; maps one to one onto DLPack's DLTensor (element strides). Only the first
 * `rank` entries of shape and strides are read. The descriptor is never modified by fvattn; outputs
 * are written through `data`.
 * Rules every tensor argument is checked against: data not NULL and 16-byte aligned; rank and dtype
 * as the operation says; shape[i] >= 1; strides[i] >= 0 with strides[rank-1] == 1; the largest
 * element offset fits in 64 bits; for bf16/f16 attention tensors, every stride but the last a
 * multiple of 8 elements (16 bytes); outputs may not overlap inputs or each other; at most 2^56
 * elements (FVA_ERR_UNSUPPORTED beyond). */
typedef struct fva_tensor {
  void* data;
  int32_t dtype; /* FVA_DTYPE_* */
  int32_t rank;  /* 1..FVA_MAX_RANK */
  int64_t shape[FVA_MAX_RANK];
  int64_t strides[FVA_MAX_RANK]; /* in elements */
} fva_tensor_t;

/* ---------------------------------------------------------------------------------------------- */
/* Handles                                                                                         */
/* ---------------------------------------------------------------------------------------------- */

typedef struct fva_handle* fva_handle_t;

#define FVA_BACKEND_AUTO 0 /* CUDA when a driver and a device are present, else CPU */
#define FVA_BACKEND_CUDA 1
#define FVA_BACKEND_CPU 2

/* Which CUDA kernels a handle may run (fva_handle_options_t.kernels). */
#define FVA_KERNELS_AUTO 0     /* the fastest the device has: on sm_90 the Hopper-native (wgmma, TMA)
                                  kernels where they cover the call, the portable ones elsewhere */
#define FVA_KERNELS_PORTABLE 1 /* the portable (mma.sync) kernels only, on every device */

/* The automatic setting of a tuning option (the fields of fva_handle_options_t after `kernels`):
 * the environment variable the field names supplies the default when it is set (read once, by
 * fva_create), else the library chooses. */
#define FVA_OPTION_AUTO (-1)

typedef struct fva_handle_options {
  uint32_t struct_size;  /* sizeof(fva_handle_options_t) */
  int32_t backend;       /* FVA_BACKEND_* */
  int32_t device;        /* CUDA device ordinal; -1: the calling thread's current device (or 0) */
  int32_t deterministic; /* 1: bitwise reproducible results run to run (the CPU backend always is).
                            0 (default): the same, except on sm_90 for a QAT backward at D = 128
                            whose stored dS does not fit ds_budget_mib (see
                            fva_qat_backward_workspace_size): it then sums dQ with fp32 atomics (its
                            last bits vary run to run; dK and dV do not), which is faster than a
                            deterministic handle's dQ kernel */
  int32_t kernels;       /* FVA_KERNELS_*; appended after ABI 1: a struct_size that ends before it
                            (a client built against the older header) means FVA_KERNELS_AUTO */
  /* Tuning options, appended after `kernels` (a struct_size that ends before one of them means
   * FVA_OPTION_AUTO for it). None of them changes a result beyond what its comment says. */
  int32_t qat_forward_split;    /* sm_90 QAT forward (not causal): split the query tiles of its
                                   grid's last, partial wave over their key tiles so every SM takes a
                                   share. AUTO: planned per call from the SM count [FVATTN_QAT_SPLIT];
                                   0 or 1: never; 2..8: that many pieces (at most the key tiles).
                                   Split tiles differ from unsplit ones in rounding only */
  int32_t qat_forward_clusters; /* sm_90 QAT forward in clusters of two blocks that share their K/V
                                   loads, where the shape allows and the device keeps every SM busy
                                   with them (bit for bit the same outputs). AUTO or 1: so;
                                   0: never [FVATTN_QAT_CLUSTER] */
  int32_t ds_budget_mib;        /* sm_90 backwards: workspace for stored dS tiles (8 KiB per tile
                                   pair and head), in MiB. AUTO: 2048 [FVATTN_DS_BUDGET_MIB];
                                   0: never store dS; 1..2^30 */
  int32_t chained_launches;     /* programmatic dependent launches between the kernels of one call
                                   (sm_90+, CUDA 12.3+ driver). AUTO or 1: where supported;
                                   0: never [FVATTN_PDL] */
  int32_t cpu_threads;          /* CPU backend worker threads. AUTO: the hardware's concurrency
                                   [FVATTN_NUM_THREADS]; 1..4096 */
  int32_t ptx_jit;              /* CUDA: run the kernels' PTX (compute_80) through the driver's JIT
                                   even where the library has SASS for the device, the portable
                                   kernels only (the sm_90a-native ones have no PTX): how the code
                                   paths of devices without SASS are tested on those with it. The
                                   first call of each kernel family pays the JIT (the driver caches
                                   it). AUTO or 0: SASS where it fits; 1: the PTX [FVATTN_PTX_JIT] */
} fva_handle_options_t;

#define FVA_HANDLE_OPTIONS_INIT                                                                 \
  {(uint32_t)sizeof(fva_handle_options_t), FVA_BACKEND_AUTO, -1, 0, FVA_KERNELS_AUTO,           \
   FVA_OPTION_AUTO, FVA_OPTION_AUTO, FVA_OPTION_AUTO, FVA_OPTION_AUTO, FVA_OPTION_AUTO,         \
   FVA_OPTION_AUTO}

/* Creates a handle. opts may be NULL (defaults: FVA_HANDLE_OPTIONS_INIT).
 * Returns FVA_OK; FVA_ERR_INVALID_ARGUMENT (out NULL, struct_size too small, backend or device out of
 * range, a tuning option out of range, or an environment variable that supplies an AUTO option's
 * default malformed: the message names it); FVA_ERR_NO_DEVICE (CUDA asked for, but libcuda.so.1 cannot be loaded, cuInit fails or the
 * device does not exist); FVA_ERR_CUDA; FVA_ERR_OUT_OF_MEMORY. On failure *out is set to NULL. */
FVA_API fva_status_t fva_create(fva_handle_t* out, const fva_handle_options_t* opts);
/* Destroys a handle; NULL is a no-op. Returns FVA_OK, or FVA_ERR_INVALID_ARGUMENT (and frees
 * nothing) for a pointer that is not a live handle: one already destroyed, or never returned by
 * fva_create. After fva_destroy returns, every call with the handle, from any thread, fails with
 * FVA_ERR_INVALID_ARGUMENT ("h: ... is not a live handle") and writes nothing; until a later
 * fva_create happens to reuse its address, which then names the new handle. Destroying a handle
 * while another thread's call on it is still running is the caller's error (undefined). */
FVA_API fva_status_t fva_destroy(fva_handle_t handle);

typedef struct fva_handle_info {
  uint32_t struct_size;   /* set by the caller to sizeof(fva_handle_info_t) */
  int32_t backend;        /* FVA_BACKEND_CUDA or FVA_BACKEND_CPU (never AUTO) */
  int32_t device;         /* CUDA ordinal, -1 for the CPU backend */
  int32_t sm_major;       /* compute capability, 0 for the CPU backend */
  int32_t sm_minor;
  int32_t sm_count;       /* multiprocessors; CPU backend: worker threads */
  char image[16];         /* kernel image in use: "sm_80", "sm_86", "sm_89", "sm_90a", "sm_100f",
                             "sm_120f", "compute_80" (the PTX, JIT-compiled by the driver), "cpu";
                             "none" if no image fits */
  char device_name[256];  /* NUL-terminated */
  /* Appended after ABI 1: what the handle's options resolved to (fields past the caller's
   * struct_size are not written). */
  int32_t deterministic;
  int32_t kernels;              /* FVA_KERNELS_* */
  int32_t qat_forward_split;    /* FVA_OPTION_AUTO (planned per call), 0 (never) or 2..8 */
  int32_t qat_forward_clusters; /* 0 or 1 */
  int32_t ds_budget_mib;        /* MiB; 0: never */
  int32_t chained_launches;     /* 1 when this handle's calls chain their kernels (device and driver
                                   support it and the option allows it) */
  int32_t cpu_threads;          /* the CPU backend's worker threads (also for a CUDA handle) */
  int32_t ptx_jit;              /* 1 when this CUDA handle runs the PTX through the JIT */
  char image_reason[192];       /* why `image` runs: the SASS that fits the device, the PTX the
                                   driver JIT-compiles, or why there is none (NUL-terminated) */
} fva_handle_info_t;

/* Fills *info up to info->struct_size bytes (at least sizeof of the version-1 struct, which ends
 * after device_name) and sets info->struct_size to the bytes written.
 * Returns FVA_OK or FVA_ERR_INVALID_ARGUMENT. */
FVA_API fva_status_t fva_get_info(fva_handle_t handle, fva_handle_info_t* info);

/* ---------------------------------------------------------------------------------------------- */
/* QAT attention                                                                                   */
/* ---------------------------------------------------------------------------------------------- */

/* NVFP4 second-level scale modes (SPEC section 1). */
#define FVA_SCALE_BLOCK 0 /* per-16-element E4M3 scale only (FastVideo production) */
#define FVA_SCALE_TILE 1  /* plus one fp32 scale per kernel tile ("use_global_sf") */
#define FVA_SCALE_ROW 2   /* P only: plus one fp32 scale per tile row ("two_level_quant_P") */

/* Configuration of QAT attention. Every int32 field is 0 or 1 unless noted. FastVideo's flag names
 * are in brackets. */
typedef struct fva_qat_config {
  uint32_t struct_size;           /* sizeof(fva_qat_config_t) */
  float softmax_scale;            /* > 0, or 0 for 1/sqrt(D) */
  int32_t causal;                 /* query i sees keys j <= i */
  int32_t quantize;               /* [IS_QAT] fake-quantize Q, K, V and P; 0: plain attention */
  int32_t smooth_k;               /* subtract the per-channel mean of K over (B, H, Skv) first */
  int32_t qkv_scale;              /* FVA_SCALE_BLOCK or FVA_SCALE_TILE [use_global_sf_QKV] */
  int32_t p_scale;                /* FVA_SCALE_BLOCK, _TILE [use_global_sf_P] or _ROW [two_level_quant_P] */
  int32_t quantize_p_backward;    /* [fake_quant_P] the backward's dV uses quantized P */
  int32_t high_precision_o;       /* [use_high_prec_o] forward also writes o_hp; backward's Delta uses it */
  int32_t quantized_qkv_backward; /* [use_qat_qkv_backward] backward uses fake-quantized q, k, v */
} fva_qat_config_t;

/* FastVideo's production preset (its ATTN_QAT_TRAIN backend): quantize with block scales, quantized P
 * in the backward, high-precision o, quantized q/k/v in the backward; not causal, no smooth_k. */
#define FVA_QAT_CONFIG_INIT \
  {(uint32_t)sizeof(fva_qat_config_t), 0.0f, 0, 1, 0, FVA_SCALE_BLOCK, FVA_SCALE_BLOCK, 1, 1, 1}

/* Tensors of QAT attention (all attention tensors share one dtype, bf16 or f16):
 *   q [B, Hq, Sq, D]    k, v [B, Hkv, Skv, D]    with Hq a multiple of Hkv (GQA), D in {16, 32, 64,
 *   128, 256}, any Sq, Skv >= 1;  o, o_hp, dout, dq [B, Hq, Sq, D];  dk, dv [B, Hkv, Skv, D];
 *   lse float32 [B, Hq, Sq]: base-2 log-sum-exp of the scaled logits (natural LSE = lse * ln 2).
 * Statuses of every function below: FVA_OK, FVA_ERR_INVALID_ARGUMENT (a NULL pointer, a config field
 * out of range, a dtype, rank, shape, stride, alignment or overlap rule broken),
 * FVA_ERR_UNSUPPORTED (valid but not available on this backend/device, e.g. an unsupported head
 * dim), FVA_ERR_WORKSPACE_TOO_SMALL, FVA_ERR_CUDA, FVA_ERR_OUT_OF_MEMORY, FVA_ERR_INTERNAL. */

/* Bytes of workspace fva_qat_forward needs for these shapes and config (written to *bytes). It
 * depends on the handle: on sm_90 the native forward (not causal) splits the query tiles of its
 * grid's last, partial wave over their key tiles, 2 to 8 pieces per tile, so that every SM takes
 * a share of it, and the workspace holds the pieces' fp32 states (per piece but a tile's last:
 * 136 KiB at D = 128 with quantized P, 72 KiB unquantized or at D = 64, 40 KiB for both; with
 * quantized P 1 KiB more for its keys' row maxima, which the later pieces' FQ_P starts its
 * running max from; two flags each). A split tile's outputs are reproducible run to run and
 * differ from an unsplit tile's in rounding only (FQ_P's scales and codes are SPEC's); which
 * tiles split depends on the device's SM count and on the handle's qat_forward_split option.
 * qat_forward_clusters does not change the workspace. */
FVA_API fva_status_t fva_qat_forward_workspace_size(fva_handle_t h, const fva_qat_config_t* cfg,
                                                    const fva_tensor_t* q, const fva_tensor_t* k,
                                                    const fva_tensor_t* v, size_t* bytes);
/* Forward: writes o, lse and (when cfg->high_precision_o) o_hp. o_hp must be NULL unless
 * cfg->high_precision_o is 1. cfg NULL means FVA_QAT_CONFIG_INIT. */
FVA_API fva_status_t fva_qat_forward(fva_handle_t h, const fva_qat_config_t* cfg,
                                     const fva_tensor_t* q, const fva_tensor_t* k,
                                     const fva_tensor_t* v, const fva_tensor_t* o,
                                     const fva_tensor_t* o_hp, const fva_tensor_t* lse, void* ws,
                                     size_t ws_bytes, void* stream);
/* Bytes of workspace fva_qat_backward needs. It depends on the handle (device, deterministic,
 * ds_budget_mib):
 *   - on sm_90 the backward stores dS, 8 KiB per (64-query tile, 64-key tile) pair and head, in the
 *     workspace (dQ then costs one product per pair instead of three, and stays reproducible), at
 *     most ds_budget_mib MiB of it (default 2048; 0: never), running the (batch, kv head) pairs in
 *     chunks that fit;
 *   - when a single (batch, kv head) does not fit, a handle that is not deterministic needs an fp32
 *     dQ accumulator instead at D = 128 (4 (D + 1) bytes per query row and head, rows rounded up
 *     to 64), and a deterministic handle nothing more. */
FVA_API fva_status_t fva_qat_backward_workspace_size(fva_handle_t h, const fva_qat_config_t* cfg,
                                                     const fva_tensor_t* q, const fva_tensor_t* k,
                                                     const fva_tensor_t* v, size_t* bytes);
/* Backward, stateless: the same q, k, v and cfg as the forward, o_for_bwd (o_hp when
 * cfg->high_precision_o, else o), the forward's lse and the incoming gradient dout. Writes dq, dk, dv.
 * cfg NULL means FVA_QAT_CONFIG_INIT. */
FVA_API fva_status_t fva_qat_backward(fva_handle_t h, const fva_qat_config_t* cfg,
                                      const fva_tensor_t* q, const fva_tensor_t* k,
                                      const fva_tensor_t* v, const fva_tensor_t* o_for_bwd,
                                      const fva_tensor_t* lse, const fva_tensor_t* dout,
                                      const fva_tensor_t* dq, const fva_tensor_t* dk,
                                      const fva_tensor_t* dv, void* ws, size_t ws_bytes,
                                      void* stream);

/* NVFP4 fake quantization on its own: what QAT attention applies to q, k and v, exposed so callers
 * can quantize other tensors (weights, activations) the same way, or inspect what attention saw. */
typedef struct fva_nvfp4_config {
  uint32_t struct_size; /* sizeof(fva_nvfp4_config_t) */
  int32_t scale_mode;   /* FVA_SCALE_BLOCK or FVA_SCALE_TILE */
  int32_t tile_tokens;  /* FVA_SCALE_TILE: tokens per second-level tile, >= 1 (QAT uses 32) */
} fva_nvfp4_config_t;

#define FVA_NVFP4_CONFIG_INIT {(uint32_t)sizeof(fva_nvfp4_config_t), FVA_SCALE_BLOCK, 32}

/* y = NVFP4 fake quantization of x, in groups of 16 consecutive elements along the last dimension.
 *   x, y [B, H, S, D], bf16 or f16 (the same dtype and shape), D a multiple of 16. In tile mode the
 *   second-level scale is shared by tile_tokens consecutive tokens of one (b, h), counted from s = 0.
 * y may be x itself (same data and strides: in place) but may not otherwise overlap it. No workspace.
 * cfg NULL means FVA_NVFP4_CONFIG_INIT. Statuses as for QAT attention. */
FVA_API fva_status_t fva_nvfp4_fake_quantize(fva_handle_t h, const fva_nvfp4_config_t* cfg,
                                             const fva_tensor_t* x, const fva_tensor_t* y,
                                             void* stream);

/* ---------------------------------------------------------------------------------------------- */
/* VSA block-sparse attention                                                                      */
/* ---------------------------------------------------------------------------------------------- */

typedef struct fva_vsa_config {
  uint32_t struct_size; /* sizeof(fva_vsa_config_t) */
  float softmax_scale;  /* > 0, or 0 for 1/sqrt(D) */
  int32_t block_size;   /* tokens per block; 64 is the only supported value */
} fva_vsa_config_t;

#define FVA_VSA_CONFIG_INIT {(uint32_t)sizeof(fva_vsa_config_t), 0.0f, 64}

/* Tensors of VSA (attention tensors bf16 or f16, one dtype for all; metadata int32):
 *   q [B, Hq, Sq, D] with Sq = 64 * num_q_blocks;  k, v [B, Hkv, Skv, D] with Skv = 64 * num_kv_blocks;
 *   Hq a multiple of Hkv; D in {64, 128};  o, dout, dq [B, Hq, Sq, D];  dk, dv like k;
 *   lse float32 [B, Hq, Sq] (base 2, as in QAT);
 *   q2k_idx int32 [B, Hq, num_q_blocks, max_k]: the kv blocks each q block attends, in order; only the
 *     first q2k_num[b, h, qb] entries are read (a count above max_k reads max_k), and an entry outside
 *     [0, num_kv_blocks) is skipped;
 *   q2k_num int32 [B, Hq, num_q_blocks];
 *   block_sizes int32 [num_kv_blocks]: real tokens of each kv block (they fill its first slots; values
 *     are clamped to [0, 64]).
 * A q block with no visible key gets o = 0 and lse = -inf. Index tensors are not read on the host by
 * the CUDA backend. Statuses as for QAT. cfg NULL means FVA_VSA_CONFIG_INIT.
 *
 * The contents of q2k_idx, q2k_num and block_sizes are not checked (a GPU backend could only read
 * them after synchronizing), so every backend accepts any values there and never reads or writes
 * out of bounds because of them:
 *   - an entry outside [0, num_kv_blocks) is skipped: the result is exactly that of the list without it;
 *   - q2k_num is clamped to [0, max_k]: a negative count reads no entry, one above max_k reads max_k;
 *   - block_sizes are clamped to [0, 64]: a negative size is an empty block, one above 64 a full block;
 *   - a kv block listed more than once is attended once per listing (its keys count again in the
 *     softmax and in the gradients) and appears once in the k2q inverse.
 * The same rules hold for fva_vsa_invert_indices. */

FVA_API fva_status_t fva_vsa_forward_workspace_size(fva_handle_t h, const fva_vsa_config_t* cfg,
                                                    const fva_tensor_t* q, const fva_tensor_t* k,
                                                    const fva_tensor_t* v,
                                                    const fva_tensor_t* q2k_idx, size_t* bytes);
FVA_API fva_status_t fva_vsa_forward(fva_handle_t h, const fva_vsa_config_t* cfg,
                                     const fva_tensor_t* q, const fva_tensor_t* k,
                                     const fva_tensor_t* v, const fva_tensor_t* q2k_idx,
                                     const fva_tensor_t* q2k_num, const fva_tensor_t* block_sizes,
                                     const fva_tensor_t* o, const fva_tensor_t* lse, void* ws,
                                     size_t ws_bytes, void* stream);
FVA_API fva_status_t fva_vsa_backward_workspace_size(fva_handle_t h, const fva_vsa_config_t* cfg,
                                                     const fva_tensor_t* q, const fva_tensor_t* k,
                                                     const fva_tensor_t* v,
                                                     const fva_tensor_t* q2k_idx, size_t* bytes);
/* Backward: writes dq, dk, dv. It inverts the indices itself, in its workspace, so the result is
 * deterministic; kv blocks nobody selects get exactly zero dk and dv. On sm_90 its workspace also
 * holds dS, 8 KiB per (q block, q2k_idx slot) and q head, within the handle's ds_budget_mib as for
 * fva_qat_backward_workspace_size (beyond it, dQ recomputes S and dP: slower, no extra workspace). */
FVA_API fva_status_t fva_vsa_backward(fva_handle_t h, const fva_vsa_config_t* cfg,
                                      const fva_tensor_t* q, const fva_tensor_t* k,
                                      const fva_tensor_t* v, const fva_tensor_t* o,
                                      const fva_tensor_t* lse, const fva_tensor_t* dout,
                                      const fva_tensor_t* q2k_idx, const fva_tensor_t* q2k_num,
                                      const fva_tensor_t* block_sizes, const fva_tensor_t* dq,
                                      const fva_tensor_t* dk, const fva_tensor_t* dv, void* ws,
                                      size_t ws_bytes, void* stream);

/* The inverse of the q2k lists, for callers that cache it:
 *   k2q_idx int32 [B, H, num_kv_blocks, num_q_blocks]: for each kv block, the q blocks that selected
 *     it, ascending, each once; slots past the count are set to -1;
 *   k2q_num int32 [B, H, num_kv_blocks].
 * q2k_idx and q2k_num as for the forward (H = Hq). */
FVA_API fva_status_t fva_vsa_invert_indices_workspace_size(fva_handle_t h,
                                                           const fva_tensor_t* q2k_idx,
                                                           const fva_tensor_t* k2q_idx,
                                                           size_t* bytes);
FVA_API fva_status_t fva_vsa_invert_indices(fva_handle_t h, const fva_tensor_t* q2k_idx,
                                            const fva_tensor_t* q2k_num,
                                            const fva_tensor_t* k2q_idx,
                                            const fva_tensor_t* k2q_num, void* ws,
                                            size_t ws_bytes, void* stream);

/* ---------------------------------------------------------------------------------------------- */
/* The whole VSA layer (FastVideo's video_sparse_attn)                                             */
/* ---------------------------------------------------------------------------------------------- */

/* What a VSA model calls (docs/SPEC.md section 3b): block means of q, k and v over every 64-token
 * block, a coarse attention over the blocks, the topk kv blocks of highest coarse score per q block,
 * the fine block-sparse attention (fva_vsa_forward) over them, and the coarse output added to every
 * token of its block, gated or not:  out = out_c[block] * gate + out_s  (without gate: out_c + out_s).
 * FastVideo: video_sparse_attn(q, k, v, variable_block_sizes, q_variable_block_sizes, topk,
 * block_size, compress_attn_weight) with gate = compress_attn_weight. */
typedef struct fva_vsa_layer_config {
  uint32_t struct_size; /* sizeof(fva_vsa_layer_config_t) */
  float softmax_scale;  /* > 0, or 0 for 1/sqrt(D); the coarse and the fine attention's scale */
  int32_t block_size;   /* tokens per block; 64 is the only supported value */
  int32_t topk;         /* kv blocks each q block attends, >= 1; more than num_kv_blocks means all */
} fva_vsa_layer_config_t;

/* topk 0: the caller must set it (a config left at its initializer is refused). */
#define FVA_VSA_LAYER_CONFIG_INIT {(uint32_t)sizeof(fva_vsa_layer_config_t), 0.0f, 64, 0}

/* Tensors of the VSA layer (attention tensors bf16 or f16, one dtype for all; metadata int32):
 *   q [B, Hq, Sq, D] with Sq = 64 * num_q_blocks;  k, v [B, Hkv, Skv, D] with Skv = 64 *
 *   num_kv_blocks;  Hq a multiple of Hkv; D in {64, 128};  gate, out, dout, dq, dgate like q;
 *   dk, dv like k;
 *   q_block_sizes int32 [num_q_blocks], kv_block_sizes int32 [num_kv_blocks]: real tokens of each
 *     block, which fill its first slots (clamped to [0, 64]); the block means read the real slots
 *     only, the fine branch masks the padding keys as fva_vsa_forward does, and the padding rows of
 *     out are computed like any other (fva_vsa_tile_plan says where the padding lies);
 *   q2k_idx int32 [B, Hq, num_q_blocks, min(topk, num_kv_blocks)], q2k_num int32 [B, Hq,
 *     num_q_blocks]: the selected kv blocks of each q block, ascending (outputs, optional); q2k_num
 *     is min(topk, the kv blocks of nonzero size) and the entries past it are -1.
 * A block of size 0 has mean 0 and no kv block of size 0 takes part in the coarse attention or is
 * selected (where FastVideo computes NaN). Statuses as for QAT. cfg is required (its topk has no
 * default). The reserve is caller memory like the workspace (16-byte aligned, device memory for a
 * CUDA handle); a reserve_bytes below what fva_vsa_layer_sizes said is FVA_ERR_WORKSPACE_TOO_SMALL. */

/* Bytes of workspace and of reserve (what the forward leaves for the backward: the coarse
 * attention's means and weights, the selected lists, the fine branch's output and lse) that
 * fva_vsa_layer_forward and fva_vsa_layer_backward need for these shapes on this handle. The
 * reserve is opaque, its size independent of whether a gate is given; the workspace of both calls
 * is the larger of the two (one query, one buffer). */
FVA_API fva_status_t fva_vsa_layer_sizes(fva_handle_t h, const fva_vsa_layer_config_t* cfg,
                                         const fva_tensor_t* q, const fva_tensor_t* k,
                                         const fva_tensor_t* v, size_t* workspace_bytes,
                                         size_t* reserve_bytes);
/* Forward: writes out, the reserve (reserve_bytes at least what fva_vsa_layer_sizes said; keep it
 * unchanged for the backward) and, when given, q2k_idx and q2k_num. gate may be NULL (no gate);
 * q2k_idx and q2k_num are both given or both NULL. */
FVA_API fva_status_t fva_vsa_layer_forward(fva_handle_t h, const fva_vsa_layer_config_t* cfg,
                                           const fva_tensor_t* q, const fva_tensor_t* k,
                                           const fva_tensor_t* v, const fva_tensor_t* gate,
                                           const fva_tensor_t* q_block_sizes,
                                           const fva_tensor_t* kv_block_sizes,
                                           const fva_tensor_t* out, const fva_tensor_t* q2k_idx,
                                           const fva_tensor_t* q2k_num, void* reserve,
                                           size_t reserve_bytes, void* ws, size_t ws_bytes,
                                           void* stream);
/* Backward: the forward's q, k, v, gate, block sizes, config and reserve, and dout; writes dq, dk,
 * dv and (exactly when gate is given) dgate. The selection is not differentiated (SPEC 3b). A
 * reserve written for other shapes, another config or without the gate given here is refused with
 * FVA_ERR_INVALID_ARGUMENT where the backend can tell without synchronizing: the CPU backend always;
 * the CUDA backend checks the reserve's size on the host, and its kernels check the reserve's record
 * of the forward's shapes and gate and leave every output untouched when it disagrees. */
FVA_API fva_status_t fva_vsa_layer_backward(fva_handle_t h, const fva_vsa_layer_config_t* cfg,
                                            const fva_tensor_t* q, const fva_tensor_t* k,
                                            const fva_tensor_t* v, const fva_tensor_t* gate,
                                            const fva_tensor_t* q_block_sizes,
                                            const fva_tensor_t* kv_block_sizes,
                                            const fva_tensor_t* dout, const void* reserve,
                                            size_t reserve_bytes, const fva_tensor_t* dq,
                                            const fva_tensor_t* dk, const fva_tensor_t* dv,
                                            const fva_tensor_t* dgate, void* ws, size_t ws_bytes,
                                            void* stream);

/* Where the tokens of a (T, H, W) video grid go in FastVideo's tiled sequence (host only, no
 * handle): the grid is cut into tiles of tile[0] x tile[1] x tile[2] tokens ((4, 4, 4): 64-token
 * blocks), tiles in (t, h, w) order, each tile's tokens in (t, h, w) order in the first slots of its
 * block of tile[0] * tile[1] * tile[2] slots; tiles at the grid's far edges hold fewer real tokens
 * and the rest of their block is padding. Writes, each when not NULL: slot_of_token[T * H * W] (the
 * slot of token (t, h, w) at index (t * H + h) * W + w), block_sizes[*num_blocks] (real tokens per
 * block), *num_blocks. A first call with slot_of_token and block_sizes NULL asks the block count.
 * dims >= 1 each, tile >= 1 each. Returns FVA_OK or FVA_ERR_INVALID_ARGUMENT. */
FVA_API fva_status_t fva_vsa_tile_plan(const int64_t dims[3], const int32_t tile[3],
                                       int64_t* slot_of_token, int32_t* block_sizes,
                                       int64_t* num_blocks);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* FVATTN_FVATTN_H_ */
