"""What every domain stands on: settings, the database and its tables (ORM rows, `tables`),
storage, queue names, domain errors, the server's own paths, structured logs."""
