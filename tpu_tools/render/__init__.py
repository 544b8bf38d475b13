"""Rendering helpers shared by the commands: units, tables, topology drawings.

Functions here build strings or rich renderables; the CLI layer writes them.
"""
