"""Command-line front ends: parse options, call the layers below, render."""
