#include "core/handle_registry.h"

#include <mutex>
#include <unordered_set>

namespace fva {
namespace {

struct Registry {
  std::mutex mutex;
  std::unordered_set<const fva_handle*> live;
};

// Never destroyed: handles may be checked from static destructors of other libraries.
Registry& registry() {
  static Registry* r = new Registry;
  return *r;
}

}  // namespace

void register_handle(const fva_handle* h) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.live.insert(h);
}

bool unregister_handle(const fva_handle* h) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  return r.live.erase(h) == 1;
}

bool is_live_handle(const fva_handle* h) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  return r.live.count(h) == 1;
}

}  // namespace fva
