// placeholder for modules that have no sources yet
