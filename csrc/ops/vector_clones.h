// AM_VECTOR_CLONES: compile a hot loop twice (AVX2+FMA and baseline x86-64) and pick one at load time, so the
// extension runs on any x86-64 CPU and vectorizes wide where it can. Empty on other compilers/architectures.
#pragma once

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define AM_VECTOR_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define AM_VECTOR_CLONES
#endif
