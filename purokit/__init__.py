"""What every package needs and nothing more: atomic files, hashing, run manifests, the Document
schema and component contract, config loading, logging.

Kept deliberately small (ARCHITECTURE.md: "do not let it become a junk drawer")."""
