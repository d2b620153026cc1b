"""hymem_train"""
