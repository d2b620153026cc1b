"""Framework adapters; each module is imported only inside its own sandbox venv."""
