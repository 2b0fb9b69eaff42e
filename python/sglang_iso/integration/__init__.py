"""The one layer that touches SGLang internals.

Every SGLang symbol sglang-iso imports, subclasses or hooks is listed in
:mod:`sglang_iso.integration.symbols`, and the compatibility test checks each one
against the pinned wheel, so an upgrade fails loudly instead of silently running
unhardened. Nothing outside this package imports ``sglang.srt``.
"""
