"""The model shapes of the benchmark (DESIGN.md section 7) and its token counts."""
SHAPES = {  # name: (H, I, E, k, E used here, note)
    "qwen3-30b-a3b": (2048, 768, 128, 8, 128, ""),
    "mixtral-8x7b": (4096, 14336, 8, 2, 8, ""),
    "deepseek-v3": (7168, 2048, 256, 8, 32, "E shrunk 256 -> 32 to fit memory"),
    "gpt-oss-20b": (2880, 2880, 32, 4, 32, "swigluoai, biases"),
}
MS = (1, 4, 16, 64, 256, 1024)
