// The set of live handles: what fva_create made and fva_destroy has not yet destroyed. Every entry
// point checks its handle here first, so a handle used after fva_destroy (from this thread or
// another) fails with FVA_ERR_INVALID_ARGUMENT instead of reading freed memory, and a second
// fva_destroy of one handle is refused instead of freeing it twice. The lookup takes no lock (a few
// atomic loads of an open-addressing table, handle_registry.cpp), so calls on many threads do not
// wait on each other for it.
//
// What it cannot tell: a call that is already running when another thread destroys its handle
// (fvattn.h: the caller must not destroy a handle while calls on it are in flight), and an address
// that a later fva_create reuses (the stale pointer then names the new handle).
#pragma once

struct fva_handle;

namespace fva {

void register_handle(const fva_handle* h);
// Removes h; false (and nothing removed) when h is not a live handle.
bool unregister_handle(const fva_handle* h);
bool is_live_handle(const fva_handle* h);

}  // namespace fva
