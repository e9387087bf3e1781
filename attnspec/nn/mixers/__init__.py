"""Sequence mixers built from IR nodes, one module per family: :mod:`.linear` (the gated linear family),
:mod:`.softmax`, :mod:`.scatterbrain`, :mod:`.delta`, :mod:`.mla` (latent attention), :mod:`.mamba`
(Mamba-1), :mod:`.rglru` (Griffin), :mod:`.mlstm` (xLSTM), :mod:`.conv` (gated convolution), :mod:`.rwkv`
(RWKV-4's time and channel mixing), :mod:`.parallel` (branches side by side) and :mod:`.none`, each a
:class:`Mixer` with the parts it opts into (:mod:`.parts`: projections and output stages, a key/value
cache, rerunning over a prefix). Importing this package registers them; a plugin family derives from
:class:`Mixer` the same way.
"""

from attnspec.nn.mixers import (conv, delta, linear, mamba, mla, mlstm, none, parallel,  # noqa: F401  (registers)
                                rglru, rwkv, scatterbrain, softmax)
from attnspec.nn.mixers.base import Mixer
from attnspec.nn.mixers.parts import KeyValueCache, PrefixRerun, ProjectedMixer

__all__ = ["KeyValueCache", "Mixer", "PrefixRerun", "ProjectedMixer"]
