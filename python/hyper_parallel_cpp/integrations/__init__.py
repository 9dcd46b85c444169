"""Routes from other frameworks' DTensors to our kernels, one module per framework.

Each imports its framework only when its ``install()`` is called, so the package imports
without any of them.
"""
