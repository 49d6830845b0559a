// The SPEC 3b selection rule as a check of someone else's selection (reference64.h:
// check_selection): one implementation for the CPU and GPU test suites, `fvattn demo` and
// `fvattn soak`.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "reference64.h"

namespace ref64 {

double dtype_step(DType dt, double x) {
  const int mant = dt == DType::BF16 ? 7 : 10;
  const int emin = dt == DType::BF16 ? -126 : -14;
  int ex = 0;
  std::frexp(x == 0.0 ? 1e-300 : x, &ex);
  return std::ldexp(1.0, std::max(ex - 1, emin) - mant);
}

SelectionCheck check_selection(DType dt, const std::vector<int32_t>& idx,
                               const std::vector<int32_t>& num, const std::vector<double>& scores,
                               const std::vector<int32_t>& kv_block_sizes, int64_t rows, int64_t topk,
                               const VsaLayerSelection* want) {
  const int64_t nkv = static_cast<int64_t>(kv_block_sizes.size());
  const VsaLayerSelection own =
      want ? VsaLayerSelection{} : vsa_layer_select(scores, 1, 1, rows, kv_block_sizes, topk);
  const VsaLayerSelection& w = want ? *want : own;
  const int64_t k = w.k;
  auto size_of = [&](int64_t j) { return std::min(std::max(kv_block_sizes[static_cast<size_t>(j)], 0), 64); };
  SelectionCheck c;
  if (idx.size() != static_cast<size_t>(rows * k) || num.size() != static_cast<size_t>(rows)) {
    c.bad_rows = rows;
    c.first_bad = "the lists' sizes are not [rows, k] and [rows]";
    return c;
  }
  for (int64_t r = 0; r < rows; ++r) {
    const int32_t* g = idx.data() + r * k;
    const int32_t* e = w.q2k_idx.data() + r * k;
    const int32_t n = w.q2k_num[static_cast<size_t>(r)];
    auto bad = [&](const std::string& why) {
      if (c.bad_rows++ == 0) c.first_bad = "q block row " + std::to_string(r) + ": " + why;
    };
    if (num[static_cast<size_t>(r)] != n) {
      bad("q2k_num " + std::to_string(num[static_cast<size_t>(r)]) + ", expected " + std::to_string(n));
      continue;
    }
    if (std::equal(g, g + k, e)) continue;
    bool valid = n > 0;
    for (int64_t t = 0; t < k; ++t) {
      if (t >= n) valid = valid && g[t] == -1;  // past q2k_num: -1
      else valid = valid && g[t] >= 0 && g[t] < nkv && size_of(g[t]) > 0 && (t == 0 || g[t] > g[t - 1]);
    }
    if (!valid) {
      bad("not an ascending list of blocks of nonzero size followed by -1");
      continue;
    }
    // The k-th and (k+1)-th highest scores of the row, and the band one dtype step around them.
    const double* s = scores.data() + r * nkv;
    std::vector<double> sorted;
    for (int64_t j = 0; j < nkv; ++j)
      if (size_of(j) > 0) sorted.push_back(s[j]);
    std::sort(sorted.rbegin(), sorted.rend());
    if (static_cast<int64_t>(sorted.size()) <= n) {  // every block taken: no choice to differ in
      bad("differs although every block of nonzero size is selected");
      continue;
    }
    const double sk = sorted[static_cast<size_t>(n - 1)], sk1 = sorted[static_cast<size_t>(n)];
    const double step = dtype_step(dt, std::max(std::fabs(sk), std::fabs(sk1)));
    bool in_band = sk - sk1 <= step;
    std::vector<char> chosen(static_cast<size_t>(nkv), 0);
    for (int64_t t = 0; t < n; ++t) chosen[static_cast<size_t>(g[t])] = 1;
    for (int64_t j = 0; j < nkv; ++j) {
      if (size_of(j) <= 0) continue;
      if (chosen[static_cast<size_t>(j)]) in_band = in_band && s[j] >= sk1 - step;
      else in_band = in_band && s[j] <= sk + step;
    }
    if (in_band) ++c.tie_rows;
    else bad("differs outside a one-step tie of the k-th score");
  }
  return c;
}

}  // namespace ref64
