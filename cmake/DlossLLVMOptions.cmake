# LLVM's compile flags (no exceptions, LLVM warnings) for the directory that includes this file.
# Only compiler directories include it, so its flags never reach the runtime (see DlossMLIR.cmake).
include(HandleLLVMOptions)
