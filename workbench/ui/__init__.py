"""The Textual front end: the only package that imports textual; build the app with factory.make_app."""
