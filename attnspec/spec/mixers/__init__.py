"""The mixer families, one module each (:mod:`.linear`, :mod:`.softmax`, :mod:`.scatterbrain`,
:mod:`.delta`, :mod:`.mla`, :mod:`.mamba`, :mod:`.rglru`, :mod:`.mlstm`, :mod:`.conv`, :mod:`.rwkv` (time and
channel mixing), :mod:`.parallel`
(branches of those side by side) and :mod:`.none`, no mixer) on
:class:`~attnspec.spec.mixers.base.MixerComponent`; the ``mixer`` slot lists them in this order (a
plugin family registers into it)."""

from attnspec.spec.components import declare, slot_list_field
from attnspec.spec.mixers.base import MixerComponent
from attnspec.spec.mixers.conv import GatedConvMixer
from attnspec.spec.mixers.delta import DeltaMixer
from attnspec.spec.mixers.linear import LinearMixer
from attnspec.spec.mixers.mamba import MambaMixer
from attnspec.spec.mixers.mla import MlaMixer
from attnspec.spec.mixers.mlstm import MlstmMixer
from attnspec.spec.mixers.rglru import RglruMixer
from attnspec.spec.mixers.rwkv import RwkvChannelMixer, RwkvMixer
from attnspec.spec.mixers.none import NoMixer
from attnspec.spec.mixers.parallel import ParallelMixer
from attnspec.spec.mixers.scatterbrain import ScatterbrainMixer
from attnspec.spec.mixers.softmax import SoftmaxMixer

Mixer = declare("mixer", LinearMixer, SoftmaxMixer, ScatterbrainMixer, DeltaMixer, MlaMixer, MambaMixer,
                RglruMixer, MlstmMixer, GatedConvMixer, RwkvMixer, RwkvChannelMixer, ParallelMixer, NoMixer,
                base=MixerComponent)
slot_list_field(ParallelMixer, "branches", "mixer")
