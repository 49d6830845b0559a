/* A C99 client of the installed fvattn: compiled with -std=c99 -Wall -Wextra -Werror -pedantic
 * against the installed header and library. It checks that the header is plain C, that the *_INIT
 * initializers work, and that a small QAT forward runs on the CPU backend and reports errors. */
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

  free(ws_mem);
  free(arena);
  EXPECT(fva_destroy(h) == FVA_OK);
  if (failures) fprintf(stderr, "c99 consumer: %d failure(s); last error: %s\n", failures, fva_last_error());
  else printf("c99 consumer: OK\n");
  return failures ? 1 : 0;
}
