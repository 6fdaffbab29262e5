"""Shared by every test directory.

This directory has no ``__init__.py``, so pytest puts it on ``sys.path`` for this file:
modules kept here (``history_contract``, the HistoryStore contract suite) are importable
from any test module. Their asserts are rewritten like a test module's.
"""

import pytest

pytest.register_assert_rewrite("history_contract")
