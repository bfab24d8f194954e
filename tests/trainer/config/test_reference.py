"""docs/training.md's table of config keys is the schema's: every key, its default and
its description."""

from trainer.config.reference import PAGE, config_keys, table, with_table


def test_the_page_shows_the_schemas_keys_as_they_are():
    page = PAGE.read_text()
    assert with_table(page) == page, "run python -m trainer.config.reference --write"


def test_every_key_has_a_description_and_the_table_lists_it():
    keys = list(config_keys())
    assert "env.physics_substeps" in [path for path, _, _ in keys]
    assert all(description for _, _, description in keys), [
        path for path, _, description in keys if not description
    ]
    assert all(f"| `{path}` |" in table() for path, _, _ in keys)
