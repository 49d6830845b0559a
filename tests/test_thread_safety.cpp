// Thread safety: one handle used by eight threads at once gives, bit for bit, what the
// same calls give one after another on one thread, on every backend available (CPU always, CUDA
// where there is a device). The threads share their input tensors and the handle; each has its own
// outputs and workspaces. The eight jobs mix QAT forward/backward (three configs), VSA
// forward/backward with the index inversion, and NVFP4 fake quantization, so different operations
// run side by side. Each job also makes one failing call with a message of its own first, and
// fva_last_error() must still show that message after its successful calls: the message is per
// thread, and no other thread's failure leaks into it.
#include <doctest/doctest.h>
#include <fvattn/fvattn.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "support/backends.h"
#include "support/host_tensor.h"

namespace {

using fvt::Backend;
using fvt::BackendBuffer;
using fvt::BackendTensor;
using fvt::HostTensor;

constexpr int kThreads = 8;
constexpr int kRounds = 2;

// QAT problem (GQA, Sq != Skv) and VSA problem shared by the jobs.
constexpr int64_t B = 1, Hq = 2, Hkv = 1, Sq = 96, Skv = 80, D = 64;
constexpr int64_t NQ = 2, NKV = 3, MAXK = 2;
constexpr int32_t kDtype = FVA_DTYPE_BF16;

// Inputs every job reads, on the backend.
struct Shared {
  HostTensor q{kDtype, {B, Hq, Sq, D}}, k{kDtype, {B, Hkv, Skv, D}}, v{kDtype, {B, Hkv, Skv, D}};
  HostTensor dout{kDtype, {B, Hq, Sq, D}};
  HostTensor vq{kDtype, {B, Hq, 64 * NQ, D}}, vk{kDtype, {B, Hkv, 64 * NKV, D}}, vv{kDtype, {B, Hkv, 64 * NKV, D}};
  HostTensor vdout{kDtype, {B, Hq, 64 * NQ, D}};
  HostTensor idx{FVA_DTYPE_I32, {B, Hq, NQ, MAXK}}, num{FVA_DTYPE_I32, {B, Hq, NQ}}, sizes{FVA_DTYPE_I32, {NKV}};
  std::vector<std::unique_ptr<BackendTensor>> on;  // the above, on the backend, in that order

  Shared(Backend& b, std::mt19937_64& rng) {
    for (HostTensor* t : {&q, &k, &v, &dout, &vq, &vk, &vv, &vdout}) t->fill_normal(rng);
    idx.fill_i32({0, 2, 1, 2, /**/ 2, 0, 1, 1});
    num.fill_i32({2, 1, 2, 2});
    sizes.fill_i32({64, 33, 64});
    for (HostTensor* t : {&q, &k, &v, &dout, &vq, &vk, &vv, &vdout, &idx, &num, &sizes})
      on.push_back(std::make_unique<BackendTensor>(b, *t));
  }
  const fva_tensor_t* t(int i) const { return on[static_cast<size_t>(i)]->t(); }
};
enum { kQ, kK, kV, kDout, kVq, kVk, kVv, kVdout, kIdx, kNum, kSizes };

// One thread's work: its calls (run), its outputs on the backend (downloaded for comparison).
class Job {
 public:
  virtual ~Job() = default;
  // Makes the calls; false if one failed (status and message kept for the main thread to report).
  virtual bool run(fva_handle_t h) = 0;

  std::vector<std::vector<uint8_t>> results() const {
    std::vector<std::vector<uint8_t>> r;
    for (const auto& t : outputs_) r.push_back(t->download());
    return r;
  }
  bool guards_intact() const {
    for (const auto& t : outputs_)
      if (!t->guards_intact()) return false;
    for (const auto& w : workspaces_)
      if (!w->guards_intact()) return false;
    return true;
  }
  // Poisons the outputs again (between the serial run and the threaded rounds).
  void reset() {
    for (size_t i = 0; i < outputs_.size(); ++i) {
      HostTensor& host = *hosts_[i];
      std::memset(host.data(), 0xFF, host.bytes());
      outputs_[i] = std::make_unique<BackendTensor>(b_, host);
    }
  }

  fva_status_t status = FVA_OK;  // of the first call that failed
  std::string failed_call, message;
  std::string own_error;         // the message of this job's deliberate failure
  std::string last_error_after;  // fva_last_error() after the job's calls

 protected:
  explicit Job(Backend& b) : b_(b) {}
  const fva_tensor_t* out(int32_t dtype, std::vector<int64_t> shape) {
    hosts_.push_back(std::make_unique<HostTensor>(dtype, std::move(shape)));
    std::memset(hosts_.back()->data(), 0xFF, hosts_.back()->bytes());
    outputs_.push_back(std::make_unique<BackendTensor>(b_, *hosts_.back()));
    return outputs_.back()->t();
  }
  const fva_tensor_t* out_at(size_t i) const { return outputs_[i]->t(); }
  void* workspace(size_t bytes) {
    workspaces_.push_back(std::make_unique<BackendBuffer>(b_, bytes));
    return bytes ? workspaces_.back()->data() : nullptr;
  }
  bool ok(fva_status_t st, const char* call) {
    if (st == FVA_OK) return true;
    status = st, failed_call = call, message = fva_last_error();
    return false;
  }
  // A call that must fail with this job's own message (a v length of its own), made first.
  void fail_on_purpose(fva_handle_t h, const Shared& s, int64_t bad_len) {
    fva_tensor_t v = *s.t(kV);
    v.shape[2] = bad_len;
    size_t bytes = 0;
    if (fva_qat_forward_workspace_size(h, nullptr, s.t(kQ), s.t(kK), &v, &bytes) != FVA_ERR_INVALID_ARGUMENT)
      own_error = "<the deliberate failure did not fail>";
    else
      own_error = fva_last_error();
  }

  Backend& b_;

 private:
  std::vector<std::unique_ptr<HostTensor>> hosts_;
  std::vector<std::unique_ptr<BackendTensor>> outputs_;
  std::vector<std::unique_ptr<BackendBuffer>> workspaces_;
};

// QAT forward, then backward from that forward's outputs. Workspaces are sized (queried) on the
// main thread, when the job is built.
class QatJob final : public Job {
 public:
  QatJob(Backend& b, const Shared& s, int variant, int64_t bad_len) : Job(b), s_(s), bad_len_(bad_len) {
    cfg_ = FVA_QAT_CONFIG_INIT;  // production preset
    if (variant == 1) cfg_.causal = 1, cfg_.quantize = 0, cfg_.high_precision_o = 0;
    if (variant == 2) cfg_.smooth_k = 1, cfg_.qkv_scale = FVA_SCALE_TILE, cfg_.p_scale = FVA_SCALE_ROW;
    out(kDtype, {B, Hq, Sq, D});                                  // o
    if (cfg_.high_precision_o) out(kDtype, {B, Hq, Sq, D});        // o_hp
    out(FVA_DTYPE_F32, {B, Hq, Sq});                              // lse
    out(kDtype, {B, Hq, Sq, D});                                  // dq
    out(kDtype, {B, Hkv, Skv, D});                                // dk
    out(kDtype, {B, Hkv, Skv, D});                                // dv
    size_t f = 0, g = 0;
    ok(fva_qat_forward_workspace_size(b.handle(), &cfg_, s.t(kQ), s.t(kK), s.t(kV), &f),
       "fva_qat_forward_workspace_size") &&
        ok(fva_qat_backward_workspace_size(b.handle(), &cfg_, s.t(kQ), s.t(kK), s.t(kV), &g),
           "fva_qat_backward_workspace_size");
    fwd_ws_ = workspace(f), fwd_bytes_ = f, bwd_ws_ = workspace(g), bwd_bytes_ = g;
  }
  bool run(fva_handle_t h) override {
    if (status != FVA_OK) return false;  // a workspace query failed
    fail_on_purpose(h, s_, bad_len_);
    const Shared& s = s_;
    // Outputs are re-made by reset(): look them up by position, not through stale pointers.
    const bool hp = cfg_.high_precision_o;
    const fva_tensor_t *o = out_at(0), *o_hp = hp ? out_at(1) : nullptr, *lse = out_at(hp ? 2 : 1);
    const fva_tensor_t *dq = out_at(hp ? 3 : 2), *dk = out_at(hp ? 4 : 3), *dv = out_at(hp ? 5 : 4);
    const bool r = ok(fva_qat_forward(h, &cfg_, s.t(kQ), s.t(kK), s.t(kV), o, o_hp, lse, fwd_ws_, fwd_bytes_, nullptr),
                      "fva_qat_forward") &&
                   ok(fva_qat_backward(h, &cfg_, s.t(kQ), s.t(kK), s.t(kV), hp ? o_hp : o, lse, s.t(kDout), dq, dk,
                                       dv, bwd_ws_, bwd_bytes_, nullptr),
                      "fva_qat_backward");
    last_error_after = fva_last_error();
    return r;
  }

 private:
  const Shared& s_;
  int64_t bad_len_;
  fva_qat_config_t cfg_;
  void *fwd_ws_, *bwd_ws_;
  size_t fwd_bytes_, bwd_bytes_;
};

// VSA forward, backward, and the index inversion.
class VsaJob final : public Job {
 public:
  VsaJob(Backend& b, const Shared& s, int64_t bad_len) : Job(b), s_(s), bad_len_(bad_len) {
    out(kDtype, {B, Hq, 64 * NQ, D});                // o
    out(FVA_DTYPE_F32, {B, Hq, 64 * NQ});            // lse
    out(kDtype, {B, Hq, 64 * NQ, D});                // dq
    out(kDtype, {B, Hkv, 64 * NKV, D});              // dk
    out(kDtype, {B, Hkv, 64 * NKV, D});              // dv
    out(FVA_DTYPE_I32, {B, Hq, NKV, NQ});            // k2q_idx
    out(FVA_DTYPE_I32, {B, Hq, NKV});                // k2q_num
    const fva_handle_t h = b.handle();
    size_t f = 0, g = 0, i = 0;
    ok(fva_vsa_forward_workspace_size(h, nullptr, s.t(kVq), s.t(kVk), s.t(kVv), s.t(kIdx), &f),
       "fva_vsa_forward_workspace_size") &&
        ok(fva_vsa_backward_workspace_size(h, nullptr, s.t(kVq), s.t(kVk), s.t(kVv), s.t(kIdx), &g),
           "fva_vsa_backward_workspace_size") &&
        ok(fva_vsa_invert_indices_workspace_size(h, s.t(kIdx), out_at(5), &i), "fva_vsa_invert_indices_workspace_size");
    ws_[0] = workspace(f), ws_[1] = workspace(g), ws_[2] = workspace(i);
    bytes_[0] = f, bytes_[1] = g, bytes_[2] = i;
  }
  bool run(fva_handle_t h) override {
    if (status != FVA_OK) return false;  // a workspace query failed
    fail_on_purpose(h, s_, bad_len_);
    const Shared& s = s_;
    const bool r =
        ok(fva_vsa_forward(h, nullptr, s.t(kVq), s.t(kVk), s.t(kVv), s.t(kIdx), s.t(kNum), s.t(kSizes), out_at(0),
                           out_at(1), ws_[0], bytes_[0], nullptr),
           "fva_vsa_forward") &&
        ok(fva_vsa_backward(h, nullptr, s.t(kVq), s.t(kVk), s.t(kVv), out_at(0), out_at(1), s.t(kVdout), s.t(kIdx),
                            s.t(kNum), s.t(kSizes), out_at(2), out_at(3), out_at(4), ws_[1], bytes_[1], nullptr),
           "fva_vsa_backward") &&
        ok(fva_vsa_invert_indices(h, s.t(kIdx), s.t(kNum), out_at(5), out_at(6), ws_[2], bytes_[2], nullptr),
           "fva_vsa_invert_indices");
    last_error_after = fva_last_error();
    return r;
  }

 private:
  const Shared& s_;
  int64_t bad_len_;
  void* ws_[3];
  size_t bytes_[3];
};

// NVFP4 fake quantization of the shared q into this job's y.
class Nvfp4Job final : public Job {
 public:
  Nvfp4Job(Backend& b, const Shared& s, bool tile, int64_t bad_len) : Job(b), s_(s), bad_len_(bad_len) {
    cfg_ = FVA_NVFP4_CONFIG_INIT;
    if (tile) cfg_.scale_mode = FVA_SCALE_TILE, cfg_.tile_tokens = 24;
    out(kDtype, {B, Hq, Sq, D});
  }
  bool run(fva_handle_t h) override {
    fail_on_purpose(h, s_, bad_len_);
    const bool r = ok(fva_nvfp4_fake_quantize(h, &cfg_, s_.t(kQ), out_at(0), nullptr), "fva_nvfp4_fake_quantize");
    last_error_after = fva_last_error();
    return r;
  }

 private:
  const Shared& s_;
  int64_t bad_len_;
  fva_nvfp4_config_t cfg_;
};

std::vector<std::unique_ptr<Job>> make_jobs(Backend& b, const Shared& s) {
  std::vector<std::unique_ptr<Job>> jobs;
  for (int j = 0; j < kThreads; ++j) {
    const int64_t bad_len = 7 + j;  // each job's own deliberate error message
    switch (j % 4) {
      case 0: jobs.push_back(std::make_unique<QatJob>(b, s, j / 4 == 0 ? 0 : 2, bad_len)); break;
      case 1: jobs.push_back(std::make_unique<VsaJob>(b, s, bad_len)); break;
      case 2: jobs.push_back(std::make_unique<QatJob>(b, s, 1, bad_len)); break;
      case 3: jobs.push_back(std::make_unique<Nvfp4Job>(b, s, j / 4 == 1, bad_len)); break;
    }
  }
  return jobs;
}

// The status of a job's calls; true when the backend has no kernel for one (skip the backend).
bool skipped(const Backend& b, const Job& job, int j) {
  if (job.status == FVA_ERR_UNSUPPORTED && b.is_cuda()) {
    MESSAGE(b.name() << ": job " << j << " skipped: " << job.failed_call << " is FVA_ERR_UNSUPPORTED: " << job.message);
    return true;
  }
  REQUIRE_MESSAGE(job.status == FVA_OK, b.name() << ": job " << j << ": " << job.failed_call << " -> "
                                                  << std::string(fva_status_string(job.status)) << ": " << job.message);
  return false;
}

void check_last_errors(const Backend& b, const std::vector<std::unique_ptr<Job>>& jobs) {
  for (size_t j = 0; j < jobs.size(); ++j) {
    const Job& job = *jobs[j];
    CHECK_MESSAGE(job.own_error.find("v: shape[2] is " + std::to_string(7 + j)) == 0,
                  b.name() << ": job " << j << " deliberate failure said: " << job.own_error);
    CHECK_MESSAGE(job.last_error_after == job.own_error,
                  b.name() << ": job " << j << ": fva_last_error() is \"" << job.last_error_after
                           << "\" instead of this thread's own \"" << job.own_error << "\"");
  }
}

}  // namespace

TEST_CASE("one handle, eight threads at once: bitwise the results of serial calls, on every backend") {
  const uint64_t seed = fvt::test_seed();
  for (auto& b : fvt::available_backends()) {
    INFO(b->name());
    std::mt19937_64 rng(seed ^ 0x7EADu);
    const Shared shared(*b, rng);
    std::vector<std::unique_ptr<Job>> jobs = make_jobs(*b, shared);

    // Serial: every job on this thread, one after the other.
    bool skip = false;
    for (size_t j = 0; j < jobs.size() && !skip; ++j) {
      jobs[j]->run(b->handle());
      skip = skipped(*b, *jobs[j], static_cast<int>(j));
    }
    if (skip) continue;
    b->synchronize();
    check_last_errors(*b, jobs);
    std::vector<std::vector<std::vector<uint8_t>>> serial;
    for (auto& job : jobs) serial.push_back(job->results());

    for (int round = 0; round < kRounds; ++round) {
      for (auto& job : jobs) job->reset();
      // All threads start together, so the calls really overlap.
      std::atomic<int> ready{0};
      std::vector<std::thread> threads;
      for (auto& job : jobs) {
        threads.emplace_back([&ready, &job, h = b->handle()] {
          ready.fetch_add(1);
          while (ready.load() < kThreads) std::this_thread::yield();
          job->run(h);
        });
      }
      for (auto& t : threads) t.join();
      b->synchronize();
      for (size_t j = 0; j < jobs.size(); ++j) REQUIRE_FALSE(skipped(*b, *jobs[j], static_cast<int>(j)));
      check_last_errors(*b, jobs);
      for (size_t j = 0; j < jobs.size(); ++j) {
        CHECK_MESSAGE(jobs[j]->guards_intact(), b->name() << ": job " << j << " wrote next to a buffer");
        const auto got = jobs[j]->results();
        for (size_t i = 0; i < got.size(); ++i)
          CHECK_MESSAGE(got[i] == serial[j][i], b->name() << ": round " << round << ", job " << j << ", output "
                                                          << i << " differs from the serial run");
      }
    }
    MESSAGE(b->name() << ": " << kThreads << " threads x " << kRounds << " rounds on one handle, bitwise equal to serial");
  }
}
