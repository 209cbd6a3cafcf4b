"""Transports: thin asyncio adapters around the sans-IO wire protocol."""
