"""What every domain stands on: settings, the database and its ORM models, storage, queue names,
domain errors, the server's own paths, structured logs."""
