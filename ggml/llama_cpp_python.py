"""Greedy tokens from llama-cpp-python's own Python package (its high-level Llama class) over the
llama.cpp that its 0.3.36 source distribution carries, built with dynamic backends by
ggml/build.sh: the CPU variants load from the libraries' folder, and the CLMLA backend from
GGML_BACKEND_PATH when it is set. Prints one line, "TOKENS t1 t2 ...".

    LLAMA_CPP_LIB_PATH=<tree>/build/bin PYTHONPATH=<sdist>:<diskcache> python ggml/llama_cpp_python.py MODEL.gguf N [off]

With "off" the model runs without flash attention (llama.cpp's separate attention products).
"""

import ctypes
import os
import sys

import llama_cpp.llama_cpp as lowlevel
from llama_cpp import Llama

PROMPT = "The latent cache holds one row per token, and the kernels read it"


def main():
    model, count = sys.argv[1], int(sys.argv[2])
    flash = not (len(sys.argv) > 3 and sys.argv[3] == "off")
    lib = os.environ["LLAMA_CPP_LIB_PATH"]
    # A llama.cpp built with dynamic backends has none until they are loaded, and llama-cpp-python
    # 0.3.36 loads none itself: the CPU variants from the libraries' folder, and the library that
    # GGML_BACKEND_PATH names (read by the same call).
    ctypes.CDLL(os.path.join(lib, "libggml.so")).ggml_backend_load_all_from_path(lib.encode())
    # llama.cpp 0.3.36's CPU weight repacking aborts on this model (GGML_ASSERT in
    # ggml_backend_sched_split_graph) with or without CLMLA, as with llama-completion, which takes
    # --no-repack; Llama() has no such argument, so the default model parameters it starts from
    # turn the extra buffer types off.
    defaults = lowlevel.llama_model_default_params

    def no_repack():
        params = defaults()
        params.use_extra_bufts = False
        return params

    lowlevel.llama_model_default_params = no_repack
    llm = Llama(model_path=model, n_ctx=4096, n_threads=os.cpu_count(), flash_attn=flash, seed=1, verbose=True)
    tokens = []
    for t in llm.generate(llm.tokenize(PROMPT.encode()), top_k=1, temp=0.0, reset=True):
        tokens.append(t)
        if len(tokens) == count:
            break
    print("TOKENS", " ".join(map(str, tokens)))


if __name__ == "__main__":
    main()
