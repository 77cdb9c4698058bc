"""The in-process engine: schedule -> propose -> score -> verify -> update."""
