# Included right after llama.cpp's project() call when llama-cpp-python builds it (Makefile CMAKE_ARGS).
# llama-cpp-python forces LLAMA_BUILD_COMMON on, but its Python package loads only libllama and
# libggml*: llama.cpp's common library (and cpp-httplib under it) is compiled and never used. A normal
# variable shadows the forced cache entry in llama.cpp's directory scope, and option() keeps it (CMP0077).
set(LLAMA_BUILD_COMMON OFF)
