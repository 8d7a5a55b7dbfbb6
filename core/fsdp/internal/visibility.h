// fsdp2/core/fsdp/internal/visibility.h
//
// Keeps core/fsdp/internal/ private to core/fsdp. Bazel's visibility stops
// other packages from depending on the engine's targets, but Bazel 4 still
// lets them include a header that a dependency's dependency exports. Every
// header under internal/ includes this one, which accepts only compilations
// of core/fsdp's own targets: they set FSDP2_CORE_FSDP_BUILD through
// local_defines (core/fsdp/BUILD), which dependents do not inherit.
#ifndef FSDP2_CORE_FSDP_INTERNAL_VISIBILITY_H_
#define FSDP2_CORE_FSDP_INTERNAL_VISIBILITY_H_

#ifndef FSDP2_CORE_FSDP_BUILD
#error "core/fsdp/internal/ is private to core/fsdp: include core/fsdp/fully_shard.h or core/fsdp/deferred_init.h instead"
#endif

#endif  // FSDP2_CORE_FSDP_INTERNAL_VISIBILITY_H_
