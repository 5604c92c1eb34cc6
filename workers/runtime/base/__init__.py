"""What every room of the runtime may use: typed settings, the error classification
(transient, permanent, fatal), waiting that a stop cuts short, the retry policy and the
running release.

Imports nothing of the runtime's other rooms; reads the environment only through
`settings` (at the entry point). It decides how long to wait, never what a fact means.
"""
