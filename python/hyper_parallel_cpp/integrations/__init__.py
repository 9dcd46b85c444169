"""Routes from other frameworks' DTensors to our kernels, one module per framework.

Each imports its framework only when its entry point is called (``hyperparallel.install()``,
``torchtitan.use_vocab_parallel_loss()``), so the package imports without any of them.
"""
