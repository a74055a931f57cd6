"""Integrations of privguard with training frameworks (``privguard.integrations``).

Each integration lives in its own module and imports its framework lazily,
with an install hint when the optional extra is missing. None ships yet: the
Opacus, Lightning, Hugging Face and Ray integrations are tracked as separate
issues.
"""
