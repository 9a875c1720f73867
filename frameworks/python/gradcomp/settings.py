"""Every gradcomp setting: ``python3 -m gradcomp.settings`` prints the registry as docs/settings.md's
Markdown table (variable, CGX alias, default, allowed values, meaning)."""
from gradcomp import _core


def main():
    print(_core.settings_table(), end="")


if __name__ == "__main__":
    main()
