"""Server glue: the launcher's own flags and the defaults it picks."""
