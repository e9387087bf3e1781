"""Diagnostics on any spec or trained run (``attnspec diagnose ...``): measurements the papers make,
each writing a table (CSV) and a plot (PNG and SVG).

- :mod:`.rank_collapse`: the relative residual of every layer and the surgery variants (Dong et al. 2021);
- :mod:`.gates`: the transitions' magnitudes and phases over positions and at marked tokens (GateLoop);
- :mod:`.attention`: the attention matrix any mixer implies (run with V = I) and its error against exact
  softmax attention of the same q and k, across the entropy of synthetic scores;
- :mod:`.paths`: path isolation, the accuracy each length of attention path carries (Dong et al. 2021);
- :mod:`.span`: accuracy against the memory span an answer needs (GateLoop's Fig. 7);
- :mod:`.scatterbrain`: sparse, low-rank and their sum against exact attention by budget, ratio and
  entropy (Scatterbrain);
- :mod:`.maps`: every block's attention map on real inputs and its locality (cosFormer's Fig. 3);
- :mod:`.subject`: what they look at, a spec at initialisation or a trained run, and the helpers
  that read a model's block inputs.
"""
