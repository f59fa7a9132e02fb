// AM_VECTOR_CLONES: compile a hot loop twice (AVX2+FMA and baseline x86-64) and pick one at load time, so the
// extension runs on any x86-64 CPU and vectorizes wide where it can. Empty on other compilers/architectures.
// AM_VECTOR_CLONES_WIDE adds an AVX-512 clone, for loops whose every result is one element's own chain of operations
// (no sum across vector lanes), so the lane count cannot change a bit: a 16-lane reduction would add in another
// order than the 8-lane one, and the same call would round differently on AVX-512 and AVX2 CPUs.
#pragma once

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define AM_VECTOR_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#define AM_VECTOR_CLONES_WIDE __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define AM_VECTOR_CLONES
#define AM_VECTOR_CLONES_WIDE
#endif
