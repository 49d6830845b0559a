#include "kernel_images.h"

#include <fmt/format.h>

#include <cstring>
#include <map>
#include <mutex>
#include <tuple>

#include "error.h"

namespace fva::cuda {

#if FVATTN_HAVE_KERNEL_IMAGES
// The fatbins kernels/embed_image.cmake embeds: <family>_sass (every SASS image and the PTX) and
// <family>_ptx (the PTX alone; null: no PTX).
#define FVA_KERNEL_FAMILY(family) \
  extern const void* const family##_sass; \
  extern const void* const family##_ptx;
namespace images {
FVA_KERNEL_FAMILY(qat)
FVA_KERNEL_FAMILY(vsa)
FVA_KERNEL_FAMILY(prep)
FVA_KERNEL_FAMILY(layer)
FVA_KERNEL_FAMILY(sm90)  // SASS for sm_90a only, no PTX
}  // namespace images
#undef FVA_KERNEL_FAMILY
#endif

namespace {

struct Family {
  const void* sass;
  const void* ptx;
};

bool family_images(const std::string& name, Family* f) {
#if FVATTN_HAVE_KERNEL_IMAGES
  if (name == "qat") *f = {images::qat_sass, images::qat_ptx};
  else if (name == "vsa") *f = {images::vsa_sass, images::vsa_ptx};
  else if (name == "prep") *f = {images::prep_sass, images::prep_ptx};
  else if (name == "layer") *f = {images::layer_sass, images::layer_ptx};
  else if (name == "sm90") *f = {images::sm90_sass, images::sm90_ptx};
  else return false;
  return true;
#else
  (void)name;
  (void)f;
  return false;
#endif
}

const Api& checked_api() {
  const Api* a = api();
  if (a == nullptr) {
    std::string why;
    driver_available(&why);
    fail(FVA_ERR_NO_DEVICE, "the CUDA driver is unavailable: {}", why);
  }
  return *a;
}

// Loaded libraries (context-independent: once per process) and kernels with their per-device
// shared-memory limit.
struct Registry {
  std::mutex mutex;
  std::map<std::string, CUlibrary> libraries;  // key: family + "/sass" or "/ptx"
  std::map<std::tuple<std::string, std::string, int>, std::pair<CUkernel, size_t>> kernels;
  // max_active_clusters: (kernel name, device, cluster size, threads, shared bytes) -> count.
  std::map<std::tuple<std::string, int, unsigned, unsigned, size_t>, int> max_clusters;
};

Registry& registry() {
  static Registry* r = new Registry;  // never destroyed: may be used during static destruction
  return *r;
}

CUlibrary library(const Api& a, const std::string& family, const DeviceInfo& device) {
  Family f;
  if (!family_images(family, &f))
    fail(FVA_ERR_UNSUPPORTED, "this libfvattn.so was built without CUDA kernel images (FVATTN_CUDA=OFF)");
  const bool ptx = device.ptx_jit;
  if (ptx && f.ptx == nullptr)
    fail(FVA_ERR_UNSUPPORTED,
         "the {} kernels have no PTX (SASS for sm_90a only), and this handle asks for the PTX "
         "(ptx_jit)", family);
  const std::string key = family + (ptx ? "/ptx" : "/all");
  Registry& r = registry();
  auto it = r.libraries.find(key);
  if (it != r.libraries.end()) return it->second;
  CUlibrary lib = nullptr;
  const CUresult res =
      a.cuLibraryLoadData(&lib, ptx ? f.ptx : f.sass, nullptr, nullptr, 0, nullptr, nullptr, 0);
  if (res != CUDA_SUCCESS)
    fail(res == CUDA_ERROR_NO_BINARY_FOR_GPU ? FVA_ERR_UNSUPPORTED : FVA_ERR_CUDA,
         "cannot load the {} kernel image ({}) for device {} \"{}\" (sm_{}{}): {}", family,
         image_for(device.sm_major, device.sm_minor, ptx).image, device.ordinal, device.name,
         device.sm_major, device.sm_minor, error_text(a, res));
  r.libraries.emplace(key, lib);
  return lib;
}

}  // namespace

bool images_built() {
#if FVATTN_HAVE_KERNEL_IMAGES
  return true;
#else
  return false;
#endif
}

ImageChoice image_for(int sm_major, int sm_minor, bool ptx_jit) {
#if FVATTN_HAVE_KERNEL_IMAGES
  return choose_image(sm_major, sm_minor, split_archs(FVA_SASS_ARCHS), FVA_PTX_ARCH, ptx_jit);
#else
  (void)sm_major;
  (void)sm_minor;
  (void)ptx_jit;
  return {"none", "this libfvattn.so was built without CUDA kernel images (FVATTN_CUDA=OFF)"};
#endif
}

void ensure_context(const DeviceInfo& device) {
  const Api& a = checked_api();
  CUcontext current = nullptr;
  CUresult r = a.cuCtxGetCurrent(&current);
  if (r == CUDA_SUCCESS && current != nullptr) return;
  CUcontext primary = nullptr;
  r = a.cuDevicePrimaryCtxRetain(&primary, device.device);
  if (r == CUDA_SUCCESS) r = a.cuCtxSetCurrent(primary);
  if (r != CUDA_SUCCESS)
    fail(FVA_ERR_CUDA, "cannot make the primary context of device {} current: {}", device.ordinal,
         error_text(a, r));
}

namespace {

// The calling thread's kernels, so that a launch's lookup takes no lock and allocates nothing: a
// direct-mapped cache keyed by the kernel's family, name, image (ptx_jit) and device, each entry
// with the dynamic shared memory the kernel's limit is known to allow. Entries are only ever
// replaced (a CUkernel stays valid for the process: its library is never unloaded). Zero-initialized
// thread-local storage: hash 0 is an empty slot.
struct CachedKernel {
  uint64_t hash;
  const char* family;  // a string literal of the call sites
  int ordinal;
  bool ptx;
  CUkernel kernel;
  size_t smem;
  char name[88];
};
constexpr unsigned kThreadKernels = 64;
thread_local CachedKernel t_kernels[kThreadKernels];

uint64_t kernel_hash(const char* family, const char* name, int ordinal, bool ptx) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (const char* c : {family, name})
    for (; *c; ++c) h = (h ^ static_cast<unsigned char>(*c)) * 1099511628211ull;
  h ^= static_cast<uint64_t>(ordinal) * 2 + (ptx ? 1 : 0);
  h *= 1099511628211ull;
  return h | 1;  // never 0
}

// The process-wide registry's kernel (loaded, and its shared-memory limit raised, on first use),
// under the registry's lock, with the limit it now allows.
std::pair<CUkernel, size_t> registered_kernel(const char* family, const char* name, const DeviceInfo& device,
                                              size_t smem_bytes) {
  const Api& a = checked_api();
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  // The PTX-only image's kernels are other kernels than the SASS image's of the same name.
  const auto key = std::make_tuple(std::string(family) + (device.ptx_jit ? "/ptx" : ""),
                                   std::string(name), device.ordinal);
  auto it = r.kernels.find(key);
  if (it != r.kernels.end() && it->second.second >= smem_bytes) return it->second;
  CUkernel k = nullptr;
  if (it != r.kernels.end()) {
    k = it->second.first;
  } else {
    const CUresult res = a.cuLibraryGetKernel(&k, library(a, family, device), name);
    if (res != CUDA_SUCCESS)
      fail(FVA_ERR_INTERNAL, "kernel {} is missing from the {} image: {}", name, family,
           error_text(a, res));
  }
  // A kernel's static and dynamic shared memory together above 48 KiB need the opt-in, and the
  // static part is not known here: any dynamic request sets the kernel's limit to it.
  if (smem_bytes > 0) {
    const CUresult res = a.cuKernelSetAttribute(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                                static_cast<int>(smem_bytes), k, device.device);
    if (res != CUDA_SUCCESS)
      fail(FVA_ERR_CUDA, "cannot give kernel {} {} bytes of shared memory on device {}: {}", name,
           smem_bytes, device.ordinal, error_text(a, res));
  }
  r.kernels[key] = {k, smem_bytes};
  return {k, smem_bytes};
}

}  // namespace

CUkernel kernel(const char* family, const char* name, const DeviceInfo& device, size_t smem_bytes) {
  const uint64_t hash = kernel_hash(family, name, device.ordinal, device.ptx_jit);
  CachedKernel& slot = t_kernels[hash % kThreadKernels];
  if (slot.hash == hash && slot.ordinal == device.ordinal && slot.ptx == device.ptx_jit &&
      smem_bytes <= slot.smem && std::strcmp(slot.family, family) == 0 && std::strcmp(slot.name, name) == 0)
    return slot.kernel;
  const auto [k, allowed] = registered_kernel(family, name, device, smem_bytes);
  const size_t length = std::strlen(name);
  if (length < sizeof slot.name) {
    slot.hash = hash;
    slot.family = family;
    slot.ordinal = device.ordinal;
    slot.ptx = device.ptx_jit;
    slot.kernel = k;
    slot.smem = allowed;
    std::memcpy(slot.name, name, length + 1);
  }
  return k;
}

namespace {

// The calling thread's LaunchChain: whether one is open, whether it chains its launches (false
// outside one), and whether a kernel of it has been launched since it opened or since the last
// memset_words.
struct ChainState {
  bool open = false;
  bool chaining = false;
  bool after_kernel = false;
};
thread_local ChainState t_chain;


// cuLaunchKernelEx's configuration of `d` on `stream` with its attributes (`attrs` has room for
// two): clusters where d.cluster_x > 1, and the programmatic dependency where `chained`.
CUlaunchConfig launch_config(const Launch& d, void* stream, bool chained, CUlaunchAttribute* attrs) {
  CUlaunchConfig config{};
  config.grid_x = d.grid_x;
  config.grid_y = d.grid_y;
  config.grid_z = d.grid_z;
  config.block_x = d.block;
  config.block_y = config.block_z = 1;
  config.shared_bytes = static_cast<unsigned>(d.smem);
  config.stream = stream;
  config.attrs = attrs;
  config.num_attrs = 0;
  if (d.cluster_x > 1) {
    CUlaunchAttribute& a = attrs[config.num_attrs++];
    a = CUlaunchAttribute{};
    a.id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
    a.value.cluster_dim = {d.cluster_x, 1, 1};
  }
  if (chained) {
    CUlaunchAttribute& a = attrs[config.num_attrs++];
    a = CUlaunchAttribute{};
    a.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    a.value.programmatic_stream_serialization_allowed = 1;
  }
  return config;
}
}  // namespace

bool chained_launches_supported(const DeviceInfo& device, const TuningOptions& options) {
  const Api* a = api();
  return options.chained_launches && a != nullptr && a->cuLaunchKernelEx != nullptr &&
         device.sm_major >= 9 && driver_version() >= 12030;
}

LaunchChain::LaunchChain(const DeviceInfo& device, const TuningOptions& options) {
  if (t_chain.open) return;  // joins the thread's open chain
  t_chain = ChainState{true, chained_launches_supported(device, options), false};
  opened_ = true;
}

LaunchChain::~LaunchChain() {
  if (opened_) t_chain = ChainState{};
}

void memset_words(void* address, uint32_t value, size_t words, void* stream, const char* what) {
  const Api& a = checked_api();
  const CUresult r = a.cuMemsetD32Async(reinterpret_cast<unsigned long long>(address), value, words,
                                        stream);
  if (r != CUDA_SUCCESS)
    fail(FVA_ERR_CUDA, "zeroing {} ({} bytes) failed: {}", what, 4 * words, error_text(a, r));
  t_chain.after_kernel = false;
}

void launch(CUkernel kernel, const Launch& d, void* stream, const void* params, const char* name) {
  const Api& a = checked_api();
  if (d.grid_x == 0 || d.grid_y == 0 || d.grid_z == 0) return;  // nothing to do
  void* args[] = {const_cast<void*>(params)};
  const bool chained = t_chain.chaining && t_chain.after_kernel;
  CUresult r = CUDA_SUCCESS;
  if (d.cluster_x > 1 || chained) {
    if (a.cuLaunchKernelEx == nullptr || d.grid_x % d.cluster_x != 0)
      fail(FVA_ERR_INTERNAL, "launching {} in clusters of {}: {}", name, d.cluster_x,
           a.cuLaunchKernelEx == nullptr ? "the driver has no cuLaunchKernelEx"
                                         : "the grid is not a whole number of clusters");
    CUlaunchAttribute attrs[2];
    const CUlaunchConfig config = launch_config(d, stream, chained, attrs);
    r = a.cuLaunchKernelEx(&config, kernel, args, nullptr);
  } else {
    r = a.cuLaunchKernel(kernel, d.grid_x, d.grid_y, d.grid_z, d.block, 1, 1,
                         static_cast<unsigned>(d.smem), stream, args, nullptr);
  }
  if (r != CUDA_SUCCESS)
    fail(FVA_ERR_CUDA,
         "launching {} (grid {}x{}x{}, clusters of {}, {} threads, {} bytes shared{}) failed: {}",
         name, d.grid_x, d.grid_y, d.grid_z, d.cluster_x, d.block, d.smem,
         chained ? ", chained to the kernel before it" : "", error_text(a, r));
  t_chain.after_kernel = true;  // (read only while a chain is open: the constructor resets it)
}

bool cluster_launch_available() {
  const Api* a = api();
  return a != nullptr && a->cuLaunchKernelEx != nullptr && a->cuOccupancyMaxActiveClusters != nullptr;
}

int max_active_clusters(const char* family, const char* name, const DeviceInfo& device,
                        const Launch& dims, void* stream) {
  const Api& a = checked_api();
  if (a.cuOccupancyMaxActiveClusters == nullptr || dims.cluster_x < 2) return 0;
  const CUkernel k = kernel(family, name, device, dims.smem);  // the shared-memory limit set
  // The calling thread's answers first (no lock, no allocation), then the process's.
  struct ClusterMemo {
    CUkernel kernel;
    int ordinal;
    unsigned cluster, block;
    size_t smem;
    int count;
  };
  constexpr int kMemos = 8;
  thread_local ClusterMemo t_memos[kMemos];
  thread_local int t_next_memo;
  for (const ClusterMemo& m : t_memos)
    if (m.kernel == k && m.ordinal == device.ordinal && m.cluster == dims.cluster_x && m.block == dims.block &&
        m.smem == dims.smem)
      return m.count;
  auto remember = [&](int count) {
    t_memos[t_next_memo] = {k, device.ordinal, dims.cluster_x, dims.block, dims.smem, count};
    t_next_memo = (t_next_memo + 1) % kMemos;
    return count;
  };
  Registry& r = registry();
  const auto key = std::make_tuple(std::string(name), device.ordinal, dims.cluster_x, dims.block,
                                   dims.smem);
  {
    std::lock_guard<std::mutex> lock(r.mutex);
    auto it = r.max_clusters.find(key);
    if (it != r.max_clusters.end()) return remember(it->second);
  }
  Launch one = dims;  // the query's grid: one cluster (the count does not depend on the grid)
  one.grid_x = dims.cluster_x;
  one.grid_y = one.grid_z = 1;
  CUlaunchAttribute attrs[2];
  const CUlaunchConfig config = launch_config(one, stream, false, attrs);
  int count = 0;
  if (a.cuOccupancyMaxActiveClusters(&count, k, &config) != CUDA_SUCCESS)
    return 0;  // not cached: a later call may be able to ask (e.g. outside a stream capture)
  std::lock_guard<std::mutex> lock(r.mutex);
  r.max_clusters[key] = count;
  return remember(count);
}

}  // namespace fva::cuda
