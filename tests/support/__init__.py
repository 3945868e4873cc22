"""What the tests share that is not a test: trainer helpers, data builders, fault injectors,
the rank driver. Test modules import from here, never from one another."""
