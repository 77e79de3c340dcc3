"""Benchmarks and measurement tools (README.md beside this file); `import sageattention` does not import them."""
