// Which build this is: its instruction set, and the hash of the sources and flags it was built from
// (build.py compares it with the installed sources before using a library).
#include "api.h"
#include "isa.h"

#ifndef LLMCLI_SOURCE_HASH
#define LLMCLI_SOURCE_HASH "unknown"
#endif

extern "C" LLMCLI_API const char* llmcli_variant() { return LLMCLI_VARIANT; }
extern "C" LLMCLI_API const char* llmcli_source_hash() { return LLMCLI_SOURCE_HASH; }
