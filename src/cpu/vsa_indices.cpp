// CPU reference of the k2q inverse of VSA's q2k lists (SPEC.md section 3): for each kv block, the q
// blocks that selected it, ascending and each once, so consumers of the inverse are deterministic
// (FastVideo builds it with atomics, in a run-dependent order).
#include "vsa_common.h"

namespace fva::cpu {

// k2q_num doubles as the fill cursor and the lists are built in place, so no scratch is needed.
size_t vsa_invert_indices_workspace(const VsaIndexProblem&) { return 0; }

void vsa_invert_indices(const VsaIndexProblem& p, const I32View& q2k_idx, const I32View& q2k_num,
                        const I32View& k2q_idx, const I32View& k2q_num, void* /*ws*/,
                        int threads) {
  const int64_t nqb = p.num_q_blocks, nkv = p.num_kv_blocks;
  parallel_for(p.B * p.H, threads, [&](int64_t bh) {
    const int64_t b = bh / p.H, h = bh % p.H;
    for (int64_t kv = 0; kv < nkv; ++kv) k2q_num.at(b, h, kv) = 0;
    // q blocks in ascending order append to their kv blocks' lists, so each list comes out sorted
    // and a q block that lists a kv block twice is seen as the list's current last entry.
    for (int64_t qb = 0; qb < nqb; ++qb) {
      const int64_t count = vsa::list_count(q2k_num, b, h, qb, p.max_k);
      for (int64_t t = 0; t < count; ++t) {
        const int64_t kv = q2k_idx.at(b, h, qb, t);
        if (!vsa::kv_in_range(kv, nkv)) continue;
        int32_t& n = k2q_num.at(b, h, kv);
        if (n > 0 && k2q_idx.at(b, h, kv, n - 1) == qb) continue;
        k2q_idx.at(b, h, kv, n) = static_cast<int32_t>(qb);
        ++n;
      }
    }
    for (int64_t kv = 0; kv < nkv; ++kv)
      for (int64_t slot = k2q_num.at(b, h, kv); slot < nqb; ++slot) k2q_idx.at(b, h, kv, slot) = -1;
  });
}

}  // namespace fva::cpu
