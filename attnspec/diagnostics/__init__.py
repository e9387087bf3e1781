"""Diagnostics on any spec or trained run (``attnspec diagnose ...``): measurements the papers make,
each writing a table (CSV) and a plot (PNG and SVG).

- :mod:`.rank_collapse`: the relative residual of every layer and the surgery variants (Dong et al. 2021);
- :mod:`.gates`: the transitions' magnitudes and phases over positions and at marked tokens (GateLoop);
- :mod:`.attention`: the attention matrix any mixer implies (run with V = I) and its error against exact
  softmax attention of the same q and k, across the entropy of synthetic scores;
- :mod:`.subject`: what they look at, a spec at initialisation or a trained run.
"""
