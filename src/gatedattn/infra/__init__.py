"""Infrastructure shared by every command; nothing here knows about attention.

- ``errors``: the user-facing error types (one line on the command line).
- ``io``, ``integrity``: atomic writes and the checksum manifest beside every saved file.
- ``guard``, ``sizes``: an output directory's guard, and sizes checked before allocation.
- ``settings``: ``--set KEY=VALUE`` generated from config dataclasses.
- ``device``, ``precision``: where and in which dtype to compute.
- ``provenance``: the code version and machine a result was made with.
- ``timing``, ``fmt``, ``lazy``: noisy-timing comparisons, number formatting, lazy exports.

Importing this package (or ``errors``, ``settings``, ``lazy``) does not import PyTorch.
"""
