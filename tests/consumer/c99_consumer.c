/* A C99 client of the installed fvattn: compiled with -std=c99 -Wall -Wextra -Werror -pedantic
 * against the installed header and library. It checks that the header is plain C, that the *_INIT
 * initializers work, and that small QAT forward/backward, VSA forward/backward, index inversion,
 * VSA layer forward/backward, tile plan and NVFP4 calls run on the CPU backend and report errors.
 * valgrind runs it too (valgrind_consumer.sh), so it touches every kind of entry point once. */
#include <fvattn/fvattn.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { B = 1, H = 1, S = 32, D = 16 };

static int failures = 0;
#define EXPECT(cond)                                                   \
  do {                                                                 \
    if (!(cond)) {                                                     \
      fprintf(stderr, "%s:%d: expected %s\n", __FILE__, __LINE__, #cond); \
      ++failures;                                                      \
    }                                                                  \
  } while (0)

static uint16_t bf16_bits(float x) { /* x is exactly representable in bf16 below */
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  return (uint16_t)(u >> 16);
}

static float bf16_value(uint16_t b) {
  uint32_t u = (uint32_t)b << 16;
  float x;
  memcpy(&x, &u, sizeof x);
  return x;
}

static fva_tensor_t bhsd(void* data, int32_t dtype) {
  fva_tensor_t t;
  memset(&t, 0, sizeof t);
  t.data = data;
  t.dtype = dtype;
  t.rank = 4;
  t.shape[0] = B; t.shape[1] = H; t.shape[2] = S; t.shape[3] = D;
  t.strides[3] = 1; t.strides[2] = D; t.strides[1] = (int64_t)S * D; t.strides[0] = (int64_t)H * S * D;
  return t;
}

/* The API wants 16-byte aligned data; C99 has no _Alignas, so align inside a larger allocation. */
static void* align64(void* p) { return (void*)(((uintptr_t)p + 63u) & ~(uintptr_t)63u); }

static uint16_t *q, *k, *v, *o, *o_hp;
static float* lse;

/* Host memory for one call, 64-byte aligned, freed in one go. */
static void* blocks[32];
static int nblocks = 0;
static void* block(size_t bytes, int fill) {
  void* raw = malloc(bytes + 64);
  if (!raw || nblocks == 32) abort();
  blocks[nblocks++] = raw;
  memset(align64(raw), fill, bytes);
  return align64(raw);
}
static void free_blocks(void) {
  while (nblocks > 0) free(blocks[--nblocks]);
}

static fva_tensor_t i32_tensor(void* data, int rank, const int64_t* shape) {
  fva_tensor_t t;
  int64_t stride = 1;
  int d;
  memset(&t, 0, sizeof t);
  t.data = data;
  t.dtype = FVA_DTYPE_I32;
  t.rank = rank;
  for (d = rank - 1; d >= 0; --d) {
    t.shape[d] = shape[d];
    t.strides[d] = stride;
    stride *= shape[d];
  }
  return t;
}

/* QAT backward from the forward's o_hp and lse: finite gradients. */
static int qat_backward(fva_handle_t h, const fva_qat_config_t* cfg, const fva_tensor_t* tq,
                        const fva_tensor_t* tk, const fva_tensor_t* tv, const fva_tensor_t* to_hp,
                        const fva_tensor_t* tlse) {
  const size_t n = (size_t)B * H * S * D;
  fva_tensor_t tdo = bhsd(block(n * 2, 0), FVA_DTYPE_BF16), tdq = bhsd(block(n * 2, 0xff), FVA_DTYPE_BF16);
  fva_tensor_t tdk = bhsd(block(n * 2, 0xff), FVA_DTYPE_BF16), tdv = bhsd(block(n * 2, 0xff), FVA_DTYPE_BF16);
  size_t bytes = 0, i;
  int bad = 0;
  uint16_t* dout = (uint16_t*)tdo.data;
  for (i = 0; i < n; ++i) dout[i] = bf16_bits((float)((i * 5) % 9) / 8.0f - 0.5f);
  if (fva_qat_backward_workspace_size(h, cfg, tq, tk, tv, &bytes) != FVA_OK ||
      fva_qat_backward(h, cfg, tq, tk, tv, to_hp, tlse, &tdo, &tdq, &tdk, &tdv,
                       bytes ? block(bytes, 0) : NULL, bytes, NULL) != FVA_OK) {
    fprintf(stderr, "qat backward: %s\n", fva_last_error());
    bad = 1;
  }
  for (i = 0; i < n && !bad; ++i)
    if (!isfinite(bf16_value(((uint16_t*)tdq.data)[i])) || !isfinite(bf16_value(((uint16_t*)tdk.data)[i])) ||
        !isfinite(bf16_value(((uint16_t*)tdv.data)[i])))
      bad = 1;
  free_blocks();
  if (bad) fprintf(stderr, "qat backward: failed or non-finite gradients\n");
  return bad;
}

/* VSA forward and backward over 2 q blocks and 2 kv blocks (D = 64), with an out-of-range index
 * and a ragged last block, then the index inversion. */
static int vsa_calls(fva_handle_t h) {
  enum { VS = 128, VD = 64, NB = 2, MAXK = 2 };
  const size_t n = (size_t)VS * VD;
  const int64_t idx_shape[4] = {1, 1, NB, MAXK}, num_shape[3] = {1, 1, NB}, sizes_shape[1] = {NB};
  const int64_t k2q_shape[4] = {1, 1, NB, NB}, k2q_num_shape[3] = {1, 1, NB};
  fva_vsa_config_t vcfg = FVA_VSA_CONFIG_INIT;
  fva_tensor_t t[8], tl, ti, tn, ts, tki, tkn;
  int32_t *idx, *num, *sizes;
  size_t bytes = 0, i;
  int j, bad = 0;
  for (j = 0; j < 8; ++j) {
    uint16_t* p = (uint16_t*)block(n * 2, 0xff);
    memset(&t[j], 0, sizeof t[j]);
    t[j].data = p;
    t[j].dtype = FVA_DTYPE_BF16;
    t[j].rank = 4;
    t[j].shape[0] = 1; t[j].shape[1] = 1; t[j].shape[2] = VS; t[j].shape[3] = VD;
    t[j].strides[0] = VS * VD; t[j].strides[1] = VS * VD; t[j].strides[2] = VD; t[j].strides[3] = 1;
    if (j < 3 || j == 4) /* q, k, v, dout */
      for (i = 0; i < n; ++i) p[i] = bf16_bits((float)((i * (3 + j)) % 11) / 8.0f - 0.625f);
  }
  memset(&tl, 0, sizeof tl);
  tl.data = block(VS * 4, 0xff);
  tl.dtype = FVA_DTYPE_F32;
  tl.rank = 3;
  tl.shape[0] = 1; tl.shape[1] = 1; tl.shape[2] = VS;
  tl.strides[0] = VS; tl.strides[1] = VS; tl.strides[2] = 1;
  ti = i32_tensor(block(NB * MAXK * 4, 0), 4, idx_shape);
  tn = i32_tensor(block(NB * 4, 0), 3, num_shape);
  ts = i32_tensor(block(NB * 4, 0), 1, sizes_shape);
  tki = i32_tensor(block(NB * NB * 4, 0xff), 4, k2q_shape);
  tkn = i32_tensor(block(NB * 4, 0xff), 3, k2q_num_shape);
  idx = (int32_t*)ti.data; num = (int32_t*)tn.data; sizes = (int32_t*)ts.data;
  idx[0] = 0; idx[1] = 1; num[0] = 2;   /* q block 0 sees kv blocks 0 and 1 */
  idx[2] = 1; idx[3] = 99; num[1] = 2;  /* q block 1: kv block 1, and 99 (out of range: skipped) */
  sizes[0] = 64; sizes[1] = 40;

  /* t: q k v o dout dq dk dv */
  if (fva_vsa_forward_workspace_size(h, &vcfg, &t[0], &t[1], &t[2], &ti, &bytes) != FVA_OK ||
      fva_vsa_forward(h, &vcfg, &t[0], &t[1], &t[2], &ti, &tn, &ts, &t[3], &tl,
                      bytes ? block(bytes, 0) : NULL, bytes, NULL) != FVA_OK ||
      fva_vsa_backward_workspace_size(h, &vcfg, &t[0], &t[1], &t[2], &ti, &bytes) != FVA_OK ||
      fva_vsa_backward(h, &vcfg, &t[0], &t[1], &t[2], &t[3], &tl, &t[4], &ti, &tn, &ts, &t[5],
                       &t[6], &t[7], bytes ? block(bytes, 0) : NULL, bytes, NULL) != FVA_OK ||
      fva_vsa_invert_indices_workspace_size(h, &ti, &tki, &bytes) != FVA_OK ||
      fva_vsa_invert_indices(h, &ti, &tn, &tki, &tkn, bytes ? block(bytes, 0) : NULL, bytes, NULL) !=
          FVA_OK) {
    fprintf(stderr, "vsa: %s\n", fva_last_error());
    bad = 1;
  }
  for (i = 0; i < n && !bad; ++i)
    for (j = 3; j < 8; ++j)
      if (j != 4 && !isfinite(bf16_value(((uint16_t*)t[j].data)[i]))) bad = 1;
  /* k2q: kv block 0 <- q block 0; kv block 1 <- q blocks 0, 1. */
  if (!bad) {
    const int32_t* ki = (const int32_t*)tki.data;
    const int32_t* kn = (const int32_t*)tkn.data;
    if (kn[0] != 1 || kn[1] != 2 || ki[0] != 0 || ki[1] != -1 || ki[2] != 0 || ki[3] != 1) bad = 1;
  }
  free_blocks();
  if (bad) fprintf(stderr, "vsa: failed or wrong results\n");
  return bad;
}

/* The whole VSA layer, forward and backward, over a (4, 4, 7) video grid: fva_vsa_tile_plan cuts it
 * into two 64-slot blocks of 64 and 48 real tokens, which serve as q and kv block sizes; one head,
 * D = 64, topk 1, with a gate. */
static int vsa_layer_calls(fva_handle_t h) {
  enum { LS = 128, LD = 64, NB = 2 };
  const size_t n = (size_t)LS * LD;
  const int64_t dims[3] = {4, 4, 7}, sizes_shape[1] = {NB}, idx_shape[4] = {1, 1, NB, 1},
                num_shape[3] = {1, 1, NB};
  const int32_t tile[3] = {4, 4, 4};
  int64_t slot[4 * 4 * 7], nb = 0;
  fva_vsa_layer_config_t lcfg = FVA_VSA_LAYER_CONFIG_INIT;
  fva_tensor_t t[10], ts, ti, tn;
  size_t ws_bytes = 0, reserve_bytes = 0, i;
  void *ws, *reserve;
  int j, bad = 0;
  lcfg.topk = 1;
  for (j = 0; j < 10; ++j) {
    uint16_t* p = (uint16_t*)block(n * 2, 0xff);
    memset(&t[j], 0, sizeof t[j]);
    t[j].data = p;
    t[j].dtype = FVA_DTYPE_BF16;
    t[j].rank = 4;
    t[j].shape[0] = 1; t[j].shape[1] = 1; t[j].shape[2] = LS; t[j].shape[3] = LD;
    t[j].strides[0] = LS * LD; t[j].strides[1] = LS * LD; t[j].strides[2] = LD; t[j].strides[3] = 1;
    if (j < 5) /* q, k, v, gate, dout */
      for (i = 0; i < n; ++i) p[i] = bf16_bits((float)((i * (3 + j)) % 11) / 8.0f - 0.625f);
  }
  ts = i32_tensor(block(NB * 4, 0), 1, sizes_shape);
  ti = i32_tensor(block(NB * 4, 0xff), 4, idx_shape);
  tn = i32_tensor(block(NB * 4, 0xff), 3, num_shape);
  if (fva_vsa_tile_plan(dims, tile, slot, (int32_t*)ts.data, &nb) != FVA_OK || nb != NB ||
      ((int32_t*)ts.data)[0] != 64 || ((int32_t*)ts.data)[1] != 48 || slot[4] != 64) {
    fprintf(stderr, "vsa tile plan: %s\n", fva_last_error());
    free_blocks();
    return 1;
  }
  if (fva_vsa_layer_sizes(h, &lcfg, &t[0], &t[1], &t[2], &ws_bytes, &reserve_bytes) != FVA_OK) {
    fprintf(stderr, "vsa layer sizes: %s\n", fva_last_error());
    free_blocks();
    return 1;
  }
  ws = ws_bytes ? block(ws_bytes, 0) : NULL;
  reserve = block(reserve_bytes, 0);
  /* t: q k v gate dout out dq dk dv dgate */
  if (fva_vsa_layer_forward(h, &lcfg, &t[0], &t[1], &t[2], &t[3], &ts, &ts, &t[5], &ti, &tn, reserve,
                            reserve_bytes, ws, ws_bytes, NULL) != FVA_OK ||
      fva_vsa_layer_backward(h, &lcfg, &t[0], &t[1], &t[2], &t[3], &ts, &ts, &t[4], reserve,
                             reserve_bytes, &t[6], &t[7], &t[8], &t[9], ws, ws_bytes, NULL) != FVA_OK) {
    fprintf(stderr, "vsa layer: %s\n", fva_last_error());
    bad = 1;
  }
  for (i = 0; i < n && !bad; ++i)
    for (j = 5; j < 10; ++j)
      if (!isfinite(bf16_value(((uint16_t*)t[j].data)[i]))) bad = 1;
  if (!bad && (((int32_t*)tn.data)[0] != 1 || ((int32_t*)tn.data)[1] != 1)) bad = 1;
  /* The gate is given to the forward: a backward without it is refused. */
  if (!bad && fva_vsa_layer_backward(h, &lcfg, &t[0], &t[1], &t[2], NULL, &ts, &ts, &t[4], reserve,
                                     reserve_bytes, &t[6], &t[7], &t[8], NULL, ws, ws_bytes,
                                     NULL) != FVA_ERR_INVALID_ARGUMENT)
    bad = 1;
  free_blocks();
  if (bad) fprintf(stderr, "vsa layer: failed or wrong results\n");
  return bad;
}

int main(void) {
  fva_handle_options_t opts = FVA_HANDLE_OPTIONS_INIT;
  fva_qat_config_t cfg = FVA_QAT_CONFIG_INIT;
  fva_vsa_config_t vcfg = FVA_VSA_CONFIG_INIT;
  fva_nvfp4_config_t ncfg = FVA_NVFP4_CONFIG_INIT;
  fva_handle_t h = NULL;
  fva_handle_info_t info;
  fva_tensor_t tq, tk, tv, to, to_hp, tlse;
  size_t ws_bytes = 0;
  void* ws = NULL;
  int i;
  const size_t n = (size_t)B * H * S * D;
  void* arena = malloc(5 * (n * 2 + 64) + B * H * S * 4 + 64);
  unsigned char* next;
  if (!arena) return 1;
  next = (unsigned char*)align64(arena);
  q = (uint16_t*)next; next = (unsigned char*)align64(next + n * 2);
  k = (uint16_t*)next; next = (unsigned char*)align64(next + n * 2);
  v = (uint16_t*)next; next = (unsigned char*)align64(next + n * 2);
  o = (uint16_t*)next; next = (unsigned char*)align64(next + n * 2);
  o_hp = (uint16_t*)next; next = (unsigned char*)align64(next + n * 2);
  lse = (float*)next;

  EXPECT(fva_version() == FVA_VERSION_MAJOR * 10000 + FVA_VERSION_MINOR * 100 + FVA_VERSION_PATCH);
  EXPECT(fva_abi_version() == FVA_ABI_VERSION);
  EXPECT(strcmp(fva_status_string(FVA_ERR_WORKSPACE_TOO_SMALL), "FVA_ERR_WORKSPACE_TOO_SMALL") == 0);
  EXPECT(vcfg.block_size == 64 && ncfg.scale_mode == FVA_SCALE_BLOCK);

  opts.backend = FVA_BACKEND_CPU;
  EXPECT(fva_create(&h, &opts) == FVA_OK);
  if (!h) return 1;
  info.struct_size = sizeof info;
  EXPECT(fva_get_info(h, &info) == FVA_OK);
  EXPECT(info.backend == FVA_BACKEND_CPU && strcmp(info.image, "cpu") == 0);

  for (i = 0; i < B * H * S * D; ++i) {
    q[i] = bf16_bits((float)((i * 7) % 13) / 8.0f - 0.75f);
    k[i] = bf16_bits((float)((i * 5) % 11) / 8.0f - 0.5f);
    v[i] = bf16_bits((float)((i * 3) % 7) / 4.0f - 0.75f);
    o[i] = o_hp[i] = 0xffff; /* NaN: must be overwritten */
  }
  tq = bhsd(q, FVA_DTYPE_BF16);
  tk = bhsd(k, FVA_DTYPE_BF16);
  tv = bhsd(v, FVA_DTYPE_BF16);
  to = bhsd(o, FVA_DTYPE_BF16);
  to_hp = bhsd(o_hp, FVA_DTYPE_BF16);
  memset(&tlse, 0, sizeof tlse);
  tlse.data = lse;
  tlse.dtype = FVA_DTYPE_F32;
  tlse.rank = 3;
  tlse.shape[0] = B; tlse.shape[1] = H; tlse.shape[2] = S;
  tlse.strides[0] = H * S; tlse.strides[1] = S; tlse.strides[2] = 1;

  EXPECT(fva_qat_forward_workspace_size(h, &cfg, &tq, &tk, &tv, &ws_bytes) == FVA_OK);
  void* ws_mem = malloc(ws_bytes + 64);
  if (!ws_mem) return 1;
  if (ws_bytes) ws = align64(ws_mem);
  EXPECT(fva_qat_forward(h, &cfg, &tq, &tk, &tv, &to, &to_hp, &tlse, ws, ws_bytes, NULL) == FVA_OK);
  for (i = 0; i < B * H * S * D; ++i) {
    EXPECT(isfinite(bf16_value(o[i])) && isfinite(bf16_value(o_hp[i])));
    if (failures) break;
  }
  for (i = 0; i < B * H * S; ++i) EXPECT(isfinite(lse[i]));

  /* An error: v with a different sequence length. The status and the message name the argument. */
  tv.shape[2] = S - 1;
  EXPECT(fva_qat_forward(h, &cfg, &tq, &tk, &tv, &to, &to_hp, &tlse, ws, ws_bytes, NULL) ==
         FVA_ERR_INVALID_ARGUMENT);
  EXPECT(strncmp(fva_last_error(), "v: shape[2]", 11) == 0);

  tv.shape[2] = S;

  failures += qat_backward(h, &cfg, &tq, &tk, &tv, &to_hp, &tlse);
  failures += vsa_calls(h);
  failures += vsa_layer_calls(h);
  /* NVFP4 fake quantization in place. */
  EXPECT(fva_nvfp4_fake_quantize(h, NULL, &tq, &tq, NULL) == FVA_OK);

  free(ws_mem);
  free(arena);
  EXPECT(fva_destroy(h) == FVA_OK);
  if (failures) fprintf(stderr, "c99 consumer: %d failure(s); last error: %s\n", failures, fva_last_error());
  else printf("c99 consumer: OK\n");
  return failures ? 1 : 0;
}
