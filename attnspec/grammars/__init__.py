"""The textual spec grammar (attnspec.lark), shipped as package data."""
