"""The pure core of gnomon: no I/O, no clock, no randomness.

Everything here is a function of its arguments. Time comes in as epoch milliseconds
(UTC); processors pass ``clock.now_ms()``, tests pass whatever they like.
"""
