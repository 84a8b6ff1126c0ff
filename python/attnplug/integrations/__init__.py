"""Adapters that plug attnplug into other libraries\x27 attention hooks."""
