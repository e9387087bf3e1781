"""One module per family of transformers model types (as transformers keeps ``models/<type>/``).

Each module ends with ``ARCHITECTURES = (Family(), ...)``; :mod:`attnspec.interop.registry` finds
them. A family may use another's parts (Bamba's layers are Mamba2's: ``families.mamba2``).
"""
