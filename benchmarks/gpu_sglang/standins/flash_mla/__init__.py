"""GPU BENCHMARK STAND-IN for the ``flash_mla`` package -- not the real thing, never installed by
the sgl-probe wheel.

SGLang 0.5.23 imports its FlashMLA attention backend during EAGLE draft CUDA-graph capture only to
list which backends support graphs, and that module imports ``flash_mla`` at module level. A Llama
never runs FlashMLA. Importing works; any real use raises (``FLASH_MLA_STANDIN missing ...``).
"""
from _sgl_bench_anything import install, module_getattr

__version__ = "0.0.0+benchmark.standin"
__getattr__ = module_getattr("FLASH_MLA", "flash_mla")
install("flash_mla", "FLASH_MLA")
