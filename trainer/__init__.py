"""Armature training stack: plain Python (PyTorch + Ray), never imports Django."""
