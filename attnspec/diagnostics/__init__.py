"""Diagnostics on any spec or trained run (``attnspec diagnose ...``): measurements the papers make,
each writing a table (CSV) and a plot (PNG and SVG).

- :mod:`.rank_collapse`: the relative residual of every layer and the surgery variants (Dong et al. 2021).
"""
