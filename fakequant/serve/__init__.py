"""Serving checkpoints: exports for the engines that serve LLMs (serve/gguf.py: llama.cpp)."""
