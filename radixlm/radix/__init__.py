"""Prefix caches (RadixCache, NoCache) behind one interface, and scheduling policies."""
