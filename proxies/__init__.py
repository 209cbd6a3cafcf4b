"""One long-running asyncio proxy per sensor: demand, program choice, control while listening."""
